package model_test

import (
	"compress/gzip"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"pagoda/model"
	"pagoda/testutil"
)

type storiesRef struct {
	Greedy struct {
		Tokens []int32 `json:"tokens"`
	} `json:"greedy"`
	Encode []struct {
		Text   string  `json:"text"`
		Tokens []int32 `json:"tokens"`
	} `json:"encode"`
	TeacherForced struct {
		Text       string  `json:"text"`
		NLL        float64 `json:"nll"`
		Perplexity float64 `json:"perplexity"`
	} `json:"teacher_forced"`
	Logits0 []float32 `json:"logits_pos0_after_bos"`
}

func loadStoriesRef(t *testing.T) *storiesRef {
	b, err := os.ReadFile(testutil.Shared(t, "models/llama2.c/stories260K.reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r storiesRef
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// greedy decodes from prompt on a flat cache, one token per forward pass.
func greedy(t *testing.T, m *model.Model, prompt []int32, steps int) []int32 {
	t.Helper()
	cache := model.NewFlatCache(&m.Config, 1, len(prompt)+steps)
	b := &model.Batch{Tokens: prompt, Pos: make([]int32, len(prompt)), Seq: make([]int32, len(prompt))}
	for i := range b.Pos {
		b.Pos[i] = int32(i)
	}
	logits, err := m.Forward(b, cache)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]int32(nil), prompt...)
	for s := 0; s < steps; s++ {
		id := argmax(logits)
		out = append(out, id)
		if s+1 == steps {
			break
		}
		logits, err = m.Forward(&model.Batch{Tokens: []int32{id}, Pos: []int32{int32(len(out) - 1)}, Seq: []int32{0}}, cache)
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// teacherForced returns every position's logits for tokens.
func teacherForced(t *testing.T, m *model.Model, tokens []int32) [][]float32 {
	t.Helper()
	n := len(tokens)
	cache := model.NewFlatCache(&m.Config, 1, n)
	b := &model.Batch{Tokens: tokens, Pos: make([]int32, n), Seq: make([]int32, n), Logits: make([]bool, n)}
	for i := range b.Pos {
		b.Pos[i] = int32(i)
		b.Logits[i] = true
	}
	logits, err := m.Forward(b, cache)
	if err != nil {
		t.Fatal(err)
	}
	V := m.Config.VocabSize
	rows := make([][]float32, n)
	for i := range rows {
		rows[i] = logits[i*V : (i+1)*V]
	}
	return rows
}

func logSoftmax(x []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	lse := m + math.Log(s)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - lse
	}
	return out
}

func TestStories260KAllFormats(t *testing.T) {
	ref := loadStoriesRef(t)
	tok512 := testutil.Shared(t, "models/llama2.c/tok512.bin")
	cases := []struct {
		name, path, tok string
	}{
		{"gguf", testutil.Shared(t, "models/gguf/stories260K.gguf"), ""},
		{"llama2c", testutil.Shared(t, "models/llama2.c/stories260K.bin"), tok512},
		{"hf", testutil.Shared(t, "models/derived/stories260K-hf"), tok512},
	}
	for _, tc := range cases {
		for _, refPath := range []bool{false, true} {
			name := tc.name
			if refPath {
				name += "/reference-kernels"
			}
			t.Run(name, func(t *testing.T) {
				m, err := model.Open(tc.path, model.Options{Tokenizer: tc.tok, Threads: 2, Reference: refPath})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				got := greedy(t, m, []int32{1}, 256)
				for i := range ref.Greedy.Tokens {
					if i >= len(got) || got[i] != ref.Greedy.Tokens[i] {
						t.Fatalf("greedy token %d: got %v, want %v", i, got[i], ref.Greedy.Tokens[i])
					}
				}
				rows := teacherForced(t, m, []int32{1})
				var maxd float64
				for i, v := range ref.Logits0 {
					maxd = math.Max(maxd, math.Abs(float64(rows[0][i]-v)))
				}
				if maxd > 1e-4 {
					t.Errorf("position-0 logits differ by %g (bound 1e-4)", maxd)
				}
				tok := m.Tokenizer()
				if tok == nil {
					t.Fatal("no tokenizer")
				}
				text := ref.TeacherForced.Text
				var ids []int32
				for _, e := range ref.Encode {
					if e.Text == text {
						ids = e.Tokens
					}
				}
				ppl, nll := perplexity(t, m, ids)
				if math.Abs(ppl-ref.TeacherForced.Perplexity) > 1e-3 {
					t.Errorf("perplexity %.6f, want %.6f ± 1e-3 (nll %.6f vs %.6f)", ppl, ref.TeacherForced.Perplexity, nll, ref.TeacherForced.NLL)
				}
			})
		}
	}
}

func perplexity(t *testing.T, m *model.Model, ids []int32) (float64, float64) {
	rows := teacherForced(t, m, ids)
	var nll float64
	for i := 0; i+1 < len(ids); i++ {
		nll -= logSoftmax(rows[i])[ids[i+1]]
	}
	return math.Exp(nll / float64(len(ids)-1)), nll
}

func TestStories260KQ8(t *testing.T) {
	ref := loadStoriesRef(t)
	m, err := model.Open(testutil.Shared(t, "models/llama2.c/stories260K_q8.bin"),
		model.Options{Tokenizer: testutil.Shared(t, "models/llama2.c/tok512.bin"), Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ids []int32
	for _, e := range ref.Encode {
		if e.Text == ref.TeacherForced.Text {
			ids = e.Tokens
		}
	}
	ppl, _ := perplexity(t, m, ids)
	if rel := math.Abs(ppl-ref.TeacherForced.Perplexity) / ref.TeacherForced.Perplexity; rel > 0.01 {
		t.Errorf("q8 perplexity %.4f vs float %.4f: %.2f%% apart (bound 1%%)", ppl, ref.TeacherForced.Perplexity, 100*rel)
	}
	// Generates sensibly: the greedy story starts like the float model's.
	got := greedy(t, m, []int32{1}, 32)
	same := 0
	for i := 1; i < len(got); i++ {
		if got[i] == ref.Greedy.Tokens[i] {
			same++
		} else {
			break
		}
	}
	if same < 8 {
		t.Errorf("q8 greedy agrees with the float model on only %d leading tokens: %v", same, got)
	}
	t.Logf("q8 perplexity %.4f (float %.4f), %d leading greedy tokens agree", ppl, ref.TeacherForced.Perplexity, same)
}

// --- llama.cpp golden outputs ---

type golden struct {
	Model  string `json:"model"`
	Arch   string `json:"arch"`
	Config struct {
		NExpert int `json:"n_expert"`
	} `json:"config"`
	PromptIDs  []int32     `json:"prompt_ids"`
	NPrompt    int         `json:"n_prompt"`
	Tokens     []int32     `json:"tokens"`
	LogitsF64  [][]float64 `json:"logits_f64"`
	LogitsLCPP [][]float64 `json:"logits_llamacpp"`
	GreedyOK   []int       `json:"greedy_ok_steps"`
	MustMatch  int         `json:"greedy_must_match"`
	Criteria   struct {
		KLMeanMax   float64 `json:"kl_mean_max"`
		Top1Min     float64 `json:"top1_agree_min"`
		KL32MeanMax float64 `json:"kl32_mean_max"`
	} `json:"criteria"`
	Stats struct {
		KLMean float64 `json:"kl_mean"`
	} `json:"stats"`
}

func f32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

func readGolden(t *testing.T, path string) *golden {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.NewDecoder(z).Decode(&g); err != nil {
		t.Fatal(err)
	}
	return &g
}

func klDiv(pLogits []float64, q []float32) float64 {
	pl := make([]float32, len(pLogits))
	for i, v := range pLogits {
		pl[i] = float32(v)
	}
	lp := logSoftmax64(pLogits)
	lq := logSoftmax(q)
	var kl float64
	for i := range lp {
		kl += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return kl
}

func logSoftmax64(x []float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, v)
	}
	var s float64
	for _, v := range x {
		s += math.Exp(v - m)
	}
	lse := m + math.Log(s)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v - lse
	}
	return out
}

func argmax64(x []float64) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// lcppMargin is how far llama.cpp's own batched logits at pos put want
// above the runner-up.
func lcppMargin(g *golden, pos int, want int32) float64 {
	row := g.LogitsLCPP[pos]
	best := math.Inf(-1)
	for i, v := range row {
		if int32(i) != want {
			best = math.Max(best, v)
		}
	}
	return row[want] - best
}

// TestGolden holds the forward pass to llama.cpp's golden outputs and the
// float64 reference (shared/golden/README.md). The reference kernels compute
// in float32 over dequantized weights and must meet every criterion. The
// fast kernels quantize activations to 8 bits per block for quantized
// weights, exactly as llama.cpp does, so they carry llama.cpp's own rounding
// noise: they must meet the KL and top-1 bounds, and the greedy steps where
// llama.cpp's own batched logits are not a near-tie (margin > 0.01); at the
// remaining few steps llama.cpp itself is within its rounding of a flip.
func TestGolden(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	files, _ := filepath.Glob(filepath.Join(dir, "g-*.p0.json.gz"))
	if len(files) == 0 {
		t.Skip("no golden files")
	}
	for _, p0 := range files {
		name := filepath.Base(p0)
		name = name[:len(name)-len(".p0.json.gz")]
		gs := []*golden{readGolden(t, p0), readGolden(t, filepath.Join(dir, name+".p1.json.gz"))}
		for _, reference := range []bool{true, false} {
			mode := "fast"
			if reference {
				mode = "reference"
			}
			t.Run(name+"/"+mode, func(t *testing.T) {
				checkGolden(t, filepath.Join(dir, gs[0].Model), gs, reference)
			})
		}
	}
}

func checkGolden(t *testing.T, path string, gs []*golden, reference bool) {
	m, err := model.Open(path, model.Options{Threads: 2, Reference: reference})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var klSum float64
	var n, agree, skipped, flips int
	for gi, g := range gs {
		rows := teacherForced(t, m, g.Tokens)
		flipped, flipPos := false, -1
		for i, row := range rows {
			if i >= len(g.LogitsF64) {
				break
			}
			kl := klDiv(g.LogitsF64[i], row)
			if !reference && g.Config.NExpert > 0 && !flipped && kl > 1e-3 && klDiv(g.LogitsF64[i], f32(g.LogitsLCPP[i])) < 1e-3 {
				// An 8-bit-rounded pass flips near-tie routing decisions
				// llama.cpp's own rounding left alone (README: 0-5 per
				// prompt file, one in g-qwen3moe.Q8_0.p1 that llama.cpp
				// does not flip): one such position per prompt file is
				// left out of the pooled KL and top-1, and logged.
				flipped, flipPos = true, i
				flips++
				t.Logf("p%d position %d: KL %.3g where llama.cpp's is %.3g (a routing flip of the 8-bit rounding), left out", gi, i, kl,
					klDiv(g.LogitsF64[i], f32(g.LogitsLCPP[i])))
				continue
			}
			klSum += kl
			if argmax(row) == argmax64(g.LogitsF64[i]) {
				agree++
			}
			n++
		}
		for _, step := range g.GreedyOK {
			pos := g.NPrompt - 1 + step
			want := g.Tokens[g.NPrompt+step]
			if got := argmax(rows[pos]); got != want {
				if !reference && (lcppMargin(g, pos, want) <= 0.01 || pos == flipPos) {
					// A routing flip's position is left out of the greedy
					// steps as of the KL: its logits are another expert mix.
					skipped++
					continue
				}
				t.Errorf("p%d greedy step %d: argmax %d, llama.cpp %d", gi, step, got, want)
			}
		}
		free := greedy(t, m, g.PromptIDs, g.MustMatch)
		for s := 0; s < g.MustMatch; s++ {
			if free[g.NPrompt+s] != g.Tokens[g.NPrompt+s] {
				// The teacher-forced rule for the fast path: where
				// llama.cpp's own batched logits are a near-tie, 8-bit
				// rounding may pick the other token; the runs part there.
				if pos := g.NPrompt - 1 + s; !reference && lcppMargin(g, pos, g.Tokens[g.NPrompt+s]) <= 0.01 {
					skipped++
					t.Logf("p%d free-running greedy step %d: %d, llama.cpp %d at a near-tie of its own (margin %.3g); compared up to here",
						gi, s, free[g.NPrompt+s], g.Tokens[g.NPrompt+s], lcppMargin(g, pos, g.Tokens[g.NPrompt+s]))
					break
				}
				t.Errorf("p%d free-running greedy step %d: %d, want %d", gi, s, free[g.NPrompt+s], g.Tokens[g.NPrompt+s])
				break
			}
		}
	}
	klMean := klSum / float64(n)
	top1 := float64(agree) / float64(n)
	c := gs[0].Criteria
	t.Logf("KL mean %.3g (bound %.3g, llama.cpp %.3g), top-1 %.4f (bound %.4f), near-tie greedy steps excused %d, routing flips left out %d",
		klMean, c.KLMeanMax, gs[0].Stats.KLMean, top1, c.Top1Min, skipped, flips)
	if klMean > c.KLMeanMax {
		t.Errorf("KL mean %.3g exceeds %.3g", klMean, c.KLMeanMax)
	}
	// The stored bound has 7 significant digits; 138/140 must meet 0.9857143.
	if top1 < c.Top1Min-1e-6 {
		t.Errorf("top-1 agreement %.4f below %.4f", top1, c.Top1Min)
	}
}

type top32 struct {
	IDs    []int32   `json:"ids"`
	Logits []float64 `json:"logits"`
	LSE    float64   `json:"lse"`
}

type goldenTop32 struct {
	Model     string  `json:"model"`
	PromptIDs []int32 `json:"prompt_ids"`
	NPrompt   int     `json:"n_prompt"`
	Tokens    []int32 `json:"tokens"`
	LogitsF64 []top32 `json:"logits_f64"`
	GreedyOK  []int   `json:"greedy_ok_steps"`
	MustMatch int     `json:"greedy_must_match"`
	Criteria  struct {
		KL32MeanMax float64 `json:"kl32_mean_max"`
		Top1Min     float64 `json:"top1_agree_min"`
	} `json:"criteria"`
}

// TestGoldenOllamaTiny checks the real 32000-token-vocabulary F16 model,
// whose goldens keep only each position's top 32 (KL32 criterion).
func TestGoldenOllamaTiny(t *testing.T) {
	dir := testutil.Shared(t, "golden")
	var gs []*goldenTop32
	for _, p := range []string{"ollama-tiny.F16.p0.json.gz", "ollama-tiny.F16.p1.json.gz"} {
		f, err := os.Open(filepath.Join(dir, p))
		if err != nil {
			t.Skip(err)
		}
		z, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		var g goldenTop32
		if err := json.NewDecoder(z).Decode(&g); err != nil {
			t.Fatal(err)
		}
		f.Close()
		gs = append(gs, &g)
	}
	m, err := model.Open(filepath.Join(dir, gs[0].Model), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var klSum float64
	var n, agree int
	for gi, g := range gs {
		rows := teacherForced(t, m, g.Tokens)
		for i, ref := range g.LogitsF64 {
			lq := logSoftmax(rows[i])
			var kl, pTop, qTop float64
			for j, id := range ref.IDs {
				lp := ref.Logits[j] - ref.LSE
				p := math.Exp(lp)
				kl += p * (lp - lq[id])
				pTop += p
				qTop += math.Exp(lq[id])
			}
			if pRest := 1 - pTop; pRest > 0 {
				kl += pRest * (math.Log(pRest) - math.Log(math.Max(1-qTop, 1e-300)))
			}
			klSum += kl
			if argmax(rows[i]) == ref.IDs[0] {
				agree++
			}
			n++
		}
		for _, step := range g.GreedyOK {
			pos := g.NPrompt - 1 + step
			if got, want := argmax(rows[pos]), g.Tokens[g.NPrompt+step]; got != want {
				t.Errorf("p%d greedy step %d: argmax %d, llama.cpp %d", gi, step, got, want)
			}
		}
		free := greedy(t, m, g.PromptIDs, g.MustMatch)
		for s := 0; s < g.MustMatch; s++ {
			if free[g.NPrompt+s] != g.Tokens[g.NPrompt+s] {
				t.Errorf("p%d free-running greedy step %d: %d, want %d", gi, s, free[g.NPrompt+s], g.Tokens[g.NPrompt+s])
			}
		}
	}
	kl := klSum / float64(n)
	top1 := float64(agree) / float64(n)
	t.Logf("KL32 mean %.3g (bound %.3g), top-1 %.4f (bound %.4f)", kl, gs[0].Criteria.KL32MeanMax, top1, gs[0].Criteria.Top1Min)
	if kl > gs[0].Criteria.KL32MeanMax {
		t.Errorf("KL32 mean %.3g exceeds %.3g", kl, gs[0].Criteria.KL32MeanMax)
	}
	if top1 < gs[0].Criteria.Top1Min-1e-6 {
		t.Errorf("top-1 %.4f below %.4f", top1, gs[0].Criteria.Top1Min)
	}
}

// Loading reports each repacked matrix once, in order, ending at the total,
// which is what the CLI's load bar counts on.
func TestOpenProgress(t *testing.T) {
	path := testutil.Shared(t, "golden/models/g-llama-gqa.Q8_0.gguf")
	var got []int
	total := -1
	m, err := model.Open(path, model.Options{Threads: 1, Progress: func(done, n int) {
		if total >= 0 && n != total {
			t.Errorf("total changed from %d to %d", total, n)
		}
		total = n
		got = append(got, done)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The golden llama has 7 matrices per layer, plus the embedding and
	// the output.
	if want := 7*m.Config.NLayer + 2; total != want && total != want-1 {
		t.Errorf("total %d, want %d (or %d with a tied output)", total, want, want-1)
	}
	for i, d := range got {
		if d != i+1 {
			t.Fatalf("progress %v, want 1, 2, … %d", got, total)
		}
	}
	if len(got) != total {
		t.Errorf("%d calls, want %d", len(got), total)
	}
}
