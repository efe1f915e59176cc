package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/testutil"
)

var (
	hfLoadedMu sync.Mutex
	hfLoaded   = map[string]Tokenizer{}
)

// hfLoad loads a shared tokenizer once per test binary: the big
// tokenizer.json files take seconds to parse.
func hfLoad(t *testing.T, rel string) Tokenizer {
	t.Helper()
	p := testutil.Shared(t, rel)
	hfLoadedMu.Lock()
	defer hfLoadedMu.Unlock()
	if tok, ok := hfLoaded[p]; ok {
		return tok
	}
	start := time.Now()
	tok, err := LoadHF(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %s in %v", rel, time.Since(start).Round(time.Millisecond))
	hfLoaded[p] = tok
	return tok
}

// TestHFAgainstLlamaCpp checks tokenizer.json files against llama.cpp's
// expected ids for the same model family.
func TestHFAgainstLlamaCpp(t *testing.T) {
	cases := []struct{ dir, out string }{
		{"models/tokenizers/llama3", "ggml-vocab-llama-bpe.gguf"},
		{"models/tokenizers/qwen3", "ggml-vocab-qwen2.gguf"},
		{"models/tokenizers/qwen3", "ggml-vocab-deepseek-r1-qwen.gguf"},
	}
	for _, c := range cases {
		t.Run(c.out, func(t *testing.T) {
			tok := hfLoad(t, c.dir)
			base := filepath.Join(testutil.Shared(t, "models/llama.cpp-vocab"), c.out)
			texts, want := bpeCases(t, base+".inp", base+".out")
			bad := bpeCompare(t, c.out, tok, texts, want)
			t.Logf("%s: %d/%d cases match", c.out, len(texts)-bad, len(texts))
		})
	}
}

type lenmlRef struct {
	Cases []struct {
		Text           string  `json:"text"`
		IDs            []int32 `json:"ids"`
		IDsWithSpecial []int32 `json:"ids_with_special"`
	} `json:"cases"`
}

// TestHFLenmlRefs compares against the secondary references made with a JS
// port of transformers; all of them agree today, so any difference fails.
func TestHFLenmlRefs(t *testing.T) {
	for _, dir := range []string{"mistral-7b", "deepseek-v3", "gemma3"} {
		t.Run(dir, func(t *testing.T) {
			if dir == "gemma3" && testing.Short() {
				t.Skip("gemma3 tokenizer.json is 33 MB; skipped with -short")
			}
			tok := hfLoad(t, "models/tokenizers/"+dir)
			b, err := os.ReadFile(testutil.Shared(t, "models/tokenizers/"+dir+"/ggml-vocab-test.lenml-ref.json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref lenmlRef
			if err := json.Unmarshal(b, &ref); err != nil {
				t.Fatal(err)
			}
			bad, badSpecial := 0, 0
			for i, c := range ref.Cases {
				got := tok.Encode(c.Text, Options{ParseSpecial: true})
				if !bpeEqualIDs(got, c.IDs) {
					bad++
					if bad <= 5 {
						t.Errorf("case %d %q:\n got %v\nwant %v", i, c.Text, got, c.IDs)
					}
				}
				wantSpecial := c.IDsWithSpecial
				if dir == "deepseek-v3" {
					// The JS port ignores add_bos_token=true in
					// tokenizer_config.json; transformers (and llama.cpp)
					// add <｜begin▁of▁sentence｜>.
					wantSpecial = append([]int32{0}, wantSpecial...)
				}
				if got := tok.Encode(c.Text, Options{ParseSpecial: true, AddSpecial: true}); !bpeEqualIDs(got, wantSpecial) {
					badSpecial++
					if badSpecial <= 2 {
						t.Errorf("case %d %q with special:\n got %v\nwant %v", i, c.Text, got, wantSpecial)
					}
				}
				if dec := tok.Decode(tok.Encode(c.Text, Options{})); dec != c.Text {
					t.Errorf("case %d: round trip %q -> %q", i, c.Text, dec)
				}
			}
			t.Logf("%s: %d/%d cases match (%d/%d with special tokens)", dir, len(ref.Cases)-bad, len(ref.Cases),
				len(ref.Cases)-badSpecial, len(ref.Cases))
		})
	}
}

// TestGPT2Files checks that encoder.json + vocab.bpe give llama.cpp's
// expected ids for GPT-2 and the same tokenizer as the GGUF vocabulary.
func TestGPT2Files(t *testing.T) {
	tok := hfLoad(t, "models/tokenizers/gpt2")
	base := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf")
	texts, want := bpeCases(t, base+".inp", base+".out")
	if bad := bpeCompare(t, "gpt2 files", tok, texts, want); bad > 0 {
		t.Fatalf("%d cases differ", bad)
	}
	v, merges := bpeVocabFromGGUF(t, base)
	g, err := NewBPE(v, merges)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.merges) != len(tok.(*BPE).merges) || len(g.ids) != len(tok.(*BPE).ids) {
		t.Errorf("GGUF has %d merges / %d tokens, files %d / %d", len(g.merges), len(g.ids), len(tok.(*BPE).merges), len(tok.(*BPE).ids))
	}
	for i, s := range v.Tokens {
		if tok.Vocab().Tokens[i] != s {
			t.Fatalf("token %d: GGUF %q, encoder.json %q", i, s, tok.Vocab().Tokens[i])
		}
	}
}

func TestHFSpecialTokens(t *testing.T) {
	l3 := hfLoad(t, "models/tokenizers/llama3")
	v := l3.Vocab()
	if v.BOS != 128000 || !v.AddBOS || v.Pre != "llama3" || v.Model != "gpt2" {
		t.Errorf("llama3: BOS %d AddBOS %v Pre %q Model %q", v.BOS, v.AddBOS, v.Pre, v.Model)
	}
	if v.ChatTemplate == "" || !v.IsEOG(128009) || !v.IsEOG(128001) {
		t.Errorf("llama3: template %d bytes, EOG %v", len(v.ChatTemplate), v.EOG)
	}
	got := l3.Encode("<|start_header_id|>user<|end_header_id|>\n\nHi", Options{AddSpecial: true, ParseSpecial: true})
	want := []int32{128000, 128006, 882, 128007, 271, 13347}
	if !bpeEqualIDs(got, want) {
		t.Errorf("llama3 chat: got %v want %v", got, want)
	}
	// Without ParseSpecial the markers are plain text.
	if ids := l3.Encode("<|eot_id|>", Options{}); len(ids) < 2 || l3.Decode(ids) != "<|eot_id|>" {
		t.Errorf("llama3 plain <|eot_id|>: %v", ids)
	}
	if got := l3.Decode([]int32{128000, 9906, 128009}); got != "Hello" {
		t.Errorf("llama3 decode with control tokens: %q", got)
	}

	q := hfLoad(t, "models/tokenizers/qwen3")
	qv := q.Vocab()
	if qv.AddBOS || qv.BOS != -1 || qv.EOS != 151645 || qv.Pre != "qwen2" {
		t.Errorf("qwen3: BOS %d AddBOS %v EOS %d Pre %q", qv.BOS, qv.AddBOS, qv.EOS, qv.Pre)
	}
	got = q.Encode("<|im_start|>user\nhi<think>", Options{AddSpecial: true, ParseSpecial: true})
	want = []int32{151644, 872, 198, 6023, 151667}
	if !bpeEqualIDs(got, want) {
		t.Errorf("qwen3 chat: got %v want %v", got, want)
	}
	// <think> is not special: split out even without ParseSpecial.
	if got := q.Encode("a<think>", Options{}); len(got) != 2 || got[1] != 151667 {
		t.Errorf("qwen3 <think> without ParseSpecial: %v", got)
	}
	// NFC: a decomposed é encodes like the composed one.
	if a, b := q.Encode("e\u0301t\u00e9", Options{}), q.Encode("\u00e9t\u00e9", Options{}); !bpeEqualIDs(a, b) {
		t.Errorf("qwen3 NFC: %v vs %v", a, b)
	}
}

func TestHFWarAndPeace(t *testing.T) {
	tok := hfLoad(t, "models/tokenizers/llama3")
	b, err := os.ReadFile(testutil.Shared(t, "models/ollama/tokenizer-testdata/war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() && len(b) > 200<<10 {
		b = b[:200<<10]
	}
	text := string(b)
	start := time.Now()
	ids := tok.Encode(text, Options{})
	el := time.Since(start)
	t.Logf("encoded %d bytes into %d tokens in %v (%.1f MB/s)", len(text), len(ids), el.Round(time.Millisecond),
		float64(len(text))/el.Seconds()/1e6)
	if dec := tok.Decode(ids); dec != text {
		i := 0
		for i < len(dec) && i < len(text) && dec[i] == text[i] {
			i++
		}
		t.Fatalf("round trip differs at byte %d: %q vs %q", i, dec[i:min(i+40, len(dec))], text[i:min(i+40, len(text))])
	}
	if el > 10*time.Second {
		t.Errorf("encoding took %v", el)
	}
}

func bpeWarAndPeace(t testing.TB, short int) string {
	b, err := os.ReadFile(testutil.Shared(t, "models/ollama/tokenizer-testdata/war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() && len(b) > short {
		b = b[:short]
	}
	return string(b)
}

// TestBPEStreamAndRoundTrip: every tokenizer gives war-and-peace back, and
// the incremental detokenizer agrees with Decode.
func TestBPEStreamAndRoundTrip(t *testing.T) {
	text := bpeWarAndPeace(t, 20<<10)
	if !testing.Short() {
		text = text[:min(len(text), 400<<10)]
	}
	for _, dir := range []string{"llama3", "qwen3", "mistral-7b", "deepseek-v3", "gpt2"} {
		tok := hfLoad(t, "models/tokenizers/"+dir)
		ids := tok.Encode(text, Options{})
		if got := tok.Decode(ids); got != text {
			t.Errorf("%s: round trip differs", dir)
		}
		s := NewStream(tok)
		var sb strings.Builder
		for _, id := range ids {
			sb.WriteString(s.Add(id))
		}
		sb.WriteString(s.Flush())
		if sb.String() != text {
			t.Errorf("%s: stream differs from the text", dir)
		}
	}
}

// TestBPEViaLoad goes through the package's Load (GGUF metadata reader),
// which hands gpt2 vocabularies to NewBPE.
func TestBPEViaLoad(t *testing.T) {
	for _, name := range []string{"gpt-2", "deepseek-llm", "falcon"} {
		p := testutil.Shared(t, "models/llama.cpp-vocab/ggml-vocab-"+name+".gguf")
		tok, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := tok.(*BPE); !ok {
			t.Fatalf("%s: Load gave %T", name, tok)
		}
		texts, want := bpeCases(t, p+".inp", p+".out")
		if bad := bpeCompare(t, name, tok, texts, want); bad > 0 {
			t.Errorf("%s via Load: %d cases differ", name, bad)
		}
	}
}

func TestBPEConcurrent(t *testing.T) {
	tok := hfLoad(t, "models/tokenizers/llama3")
	text := bpeWarAndPeace(t, 64<<10)[:64<<10]
	want := tok.Encode(text, Options{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := tok.Encode(text, Options{}); !bpeEqualIDs(got, want) {
				t.Error("concurrent encode differs")
			}
		}()
	}
	wg.Wait()
}

func BenchmarkBPEEncodeWarAndPeace(b *testing.B) {
	p := testutil.Shared(b, "models/tokenizers/llama3")
	tok, err := LoadHF(p)
	if err != nil {
		b.Fatal(err)
	}
	text := bpeWarAndPeace(b, 1<<30)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		// A fresh tokenizer per run would time loading; clearing the word
		// cache times the cold path.
		bt := tok.(*BPE)
		bt.mu.Lock()
		clear(bt.cache)
		bt.mu.Unlock()
		tok.Encode(text, Options{})
	}
}
