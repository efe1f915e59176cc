package engine

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"pagoda/encoder"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// embedBERTs are the synthetic encoders of the goldens; the test writes
// them again and checks their sha256 against the golden's.
var embedBERTs = map[string]synth.BERT{
	"b-mean.gguf": {Layers: 2, Embd: 64, Heads: 4, FFN: 256, Positions: 128, Pooling: 1, Seed: 1},
	"b-cls.gguf":  {Layers: 2, Embd: 64, Heads: 4, FFN: 256, Positions: 128, Pooling: 2, Seed: 2},
	"b-q8.gguf":   {Layers: 3, Embd: 96, Heads: 6, FFN: 384, Positions: 64, Pooling: 1, Type: quant.Q8_0, Seed: 3},
	"b-f16.gguf":  {Layers: 2, Embd: 64, Heads: 2, FFN: 128, Positions: 64, Pooling: 2, Type: quant.F16, Seed: 4},
}

type embedGolden struct {
	Commit  string `json:"llama_cpp_commit"`
	Command string `json:"command"`
	Model   string `json:"model"`
	SHA256  string `json:"model_sha256"`
	Pooling string `json:"pooling"`
	Inputs  []struct {
		Text      string    `json:"text"`
		Tokens    []int32   `json:"tokens"`
		Embedding []float64 `json:"embedding"`
	} `json:"inputs"`
}

func readEmbedGolden(t *testing.T, name string) *embedGolden {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "embed", name+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var g embedGolden
	if err := json.NewDecoder(zr).Decode(&g); err != nil {
		t.Fatal(err)
	}
	return &g
}

// writeBERT writes a synthetic encoder into dir and returns its path.
func writeBERT(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := synth.WriteBERT(p, embedBERTs[name]); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWriteEmbedModels writes the synthetic encoders for make.sh.
func TestWriteEmbedModels(t *testing.T) {
	dir := os.Getenv("PAGODA_EMBED_WRITE")
	if dir == "" {
		t.Skip("set PAGODA_EMBED_WRITE=DIR to write the goldens' encoder files")
	}
	for name := range embedBERTs {
		writeBERT(t, dir, name)
	}
}

type embedSubject struct {
	run  HiddenRunner
	tok  tokenizer.Tokenizer
	dim  int
	ctx  int
	pool string // the file's own pooling
}

func openEmbedSubject(t *testing.T, g *embedGolden) *embedSubject {
	t.Helper()
	if spec, ok := embedBERTs[g.Model]; ok {
		_ = spec
		p := writeBERT(t, t.TempDir(), g.Model)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != g.SHA256 {
			t.Fatalf("%s: synth writes sha256 %x, the golden was made from %s: regenerate the goldens (testdata/embed/README.md)", g.Model, h, g.SHA256)
		}
		m, err := encoder.Load(p, encoder.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return &embedSubject{m, m.Tokenizer(), m.Config.NEmbd, m.Config.ContextLen, m.Config.Pooling.String()}
	}
	p := testutil.Shared(t, "golden/models/"+g.Model)
	m, err := model.Open(p, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &embedSubject{m, m.Tokenizer(), m.Config.NEmbd, m.Config.ContextLen, m.Config.Pooling}
}

func cosine(a []float32, b []float64) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * b[i]
		na += float64(a[i]) * float64(a[i])
		nb += b[i] * b[i]
	}
	return dot / math.Sqrt(na*nb)
}

// TestEmbedGoldens holds pooled embeddings of BERT encoders and of decoders
// (mean and last pooling) to llama.cpp's llama-embedding: the same tokens,
// and cosine ≥ 0.9999 per input.
func TestEmbedGoldens(t *testing.T) {
	for _, name := range []string{"bert-mean", "bert-cls", "bert-q8-mean", "bert-f16-cls", "llama-gqa-mean", "llama-gqa-last", "qwen3-last", "deepseek2-lite-mean", "qwen3moe-last"} {
		t.Run(name, func(t *testing.T) {
			g := readEmbedGolden(t, name)
			s := openEmbedSubject(t, g)
			e, err := NewEmbedder(s.run, EmbedConfig{Dim: s.dim, ContextLen: s.ctx, Pooling: g.Pooling})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			var inputs [][]int32
			for i, in := range g.Inputs {
				ids := s.tok.Encode(in.Text, tokenizer.Options{AddSpecial: true, ParseSpecial: true})
				if !slices.Equal(ids, in.Tokens) {
					t.Fatalf("input %d %q: tokens %v, llama.cpp %v", i, in.Text, ids, in.Tokens)
				}
				inputs = append(inputs, ids)
			}
			vecs, err := e.Embed(context.Background(), inputs)
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range g.Inputs {
				c := cosine(vecs[i], in.Embedding)
				t.Logf("input %d (%d tokens): cosine %.8f", i, len(inputs[i]), c)
				if !(c >= 0.9999) {
					t.Errorf("input %d: cosine %.6f to llama.cpp, want ≥ 0.9999", i, c)
				}
			}
		})
	}
}

// TestEmbedDecoderDefaultPooling: a decoder whose file has no pooling_type
// pools by its last token, and so matches llama.cpp's --pooling last.
func TestEmbedDecoderDefaultPooling(t *testing.T) {
	g := readEmbedGolden(t, "llama-gqa-last")
	s := openEmbedSubject(t, g)
	if s.pool != "" {
		t.Fatalf("%s declares pooling %q; the test needs a file without one", g.Model, s.pool)
	}
	e, err := NewEmbedder(s.run, EmbedConfig{Dim: s.dim, ContextLen: s.ctx, Pooling: s.pool})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Pooling() != DefaultDecoderPooling || DefaultDecoderPooling != "last" {
		t.Fatalf("pooling %q, want last", e.Pooling())
	}
	in := g.Inputs[1]
	v, err := e.Embed(context.Background(), [][]int32{in.Tokens})
	if err != nil {
		t.Fatal(err)
	}
	if c := cosine(v[0], in.Embedding); !(c >= 0.9999) {
		t.Fatalf("cosine %.6f to llama.cpp --pooling last", c)
	}
}

// TestEmbedBatchInvariant: an input embedded alone equals, bit for bit,
// the same input embedded in a batch with others, whether the batch is
// one call or concurrent calls gathered into one pass.
func TestEmbedBatchInvariant(t *testing.T) {
	for _, name := range []string{"bert-mean", "bert-cls", "bert-q8-mean", "llama-gqa-mean", "qwen3-last", "deepseek2-lite-mean", "qwen3moe-last"} {
		t.Run(name, func(t *testing.T) {
			g := readEmbedGolden(t, name)
			s := openEmbedSubject(t, g)
			e, err := NewEmbedder(s.run, EmbedConfig{Dim: s.dim, ContextLen: s.ctx, Pooling: g.Pooling})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			var all [][]int32
			var alone [][]float32
			for _, in := range g.Inputs {
				all = append(all, in.Tokens)
				v, err := e.Embed(ctx, [][]int32{in.Tokens})
				if err != nil {
					t.Fatal(err)
				}
				alone = append(alone, v[0])
			}
			// Repeats and a reversed order put each input at other rows.
			batch := append(slices.Clone(all), all...)
			for i := len(all) - 1; i >= 0; i-- {
				batch = append(batch, all[i])
			}
			got, err := e.Embed(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range got {
				want := alone[i%len(all)]
				if i >= 2*len(all) {
					want = alone[len(all)-1-(i-2*len(all))]
				}
				if !slices.Equal(v, want) {
					t.Fatalf("batch row %d differs from the input alone", i)
				}
			}
			// Concurrent callers.
			var wg sync.WaitGroup
			errs := make([]error, len(all))
			for i := range all {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					v, err := e.Embed(ctx, [][]int32{all[i]})
					if err == nil && !slices.Equal(v[0], alone[i]) {
						err = errors.New("concurrent result differs from the input alone")
					}
					errs[i] = err
				}(i)
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmbedderErrors: empty, too long and out-of-range inputs are errors,
// and the embedder keeps working after them and refuses calls after Close.
func TestEmbedderErrors(t *testing.T) {
	g := readEmbedGolden(t, "bert-mean")
	s := openEmbedSubject(t, g)
	if _, err := NewEmbedder(s.run, EmbedConfig{Dim: s.dim, ContextLen: s.ctx, Pooling: "none"}); err == nil {
		t.Fatal("pooling none accepted")
	}
	e, err := NewEmbedder(s.run, EmbedConfig{Dim: s.dim, ContextLen: s.ctx, Pooling: g.Pooling})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := make([]int32, s.ctx+1)
	for _, in := range [][][]int32{nil, {{}}, {long}, {{5, 1 << 20}}} {
		if _, err := e.Embed(ctx, in); err == nil {
			t.Errorf("input %v accepted", in)
		}
	}
	if _, err := e.Embed(ctx, [][]int32{g.Inputs[0].Tokens}); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, err := e.Embed(ctx, [][]int32{g.Inputs[0].Tokens}); !errors.Is(err, ErrEmbedderClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
