package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pagoda/encoder"
	"pagoda/engine"
	"pagoda/synth"
	"pagoda/tokenizer"
)

// embedServer serves a synthetic BERT encoder (mean pooling, 128
// positions, width 64) as an embedding-only server.
func embedServer(t *testing.T) (*httptest.Server, *encoder.Model, *engine.Embedder) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bert.gguf")
	if err := synth.WriteBERT(p, synth.BERT{Layers: 2, Embd: 64, Heads: 4, FFN: 128, Positions: 128, Pooling: 1, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	m, err := encoder.Load(p, encoder.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.NewEmbedder(m, engine.EmbedConfig{Dim: m.Config.NEmbd, ContextLen: m.Config.ContextLen, Pooling: m.Config.Pooling.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	b, err := NewEmbeddingBackend(m.Tokenizer(), "bert", m.Config.ContextLen)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(b, Options{Embedder: e}).Handler())
	t.Cleanup(ts.Close)
	return ts, m, e
}

func unitNorm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func TestEmbeddingsOpenAI(t *testing.T) {
	ts, m, e := embedServer(t)
	type resp struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Object    string    `json:"object"`
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	code, b := post(t, ts, "/v1/embeddings", `{"model":"bert","input":["the cat sat on the mat.","she was happy"]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	r := decode[resp](t, b)
	ids0 := m.Tokenizer().Encode("the cat sat on the mat.", tokOpts)
	ids1 := m.Tokenizer().Encode("she was happy", tokOpts)
	if r.Object != "list" || r.Model != "bert" || len(r.Data) != 2 || r.Data[1].Index != 1 || r.Data[0].Object != "embedding" ||
		r.Usage.PromptTokens != len(ids0)+len(ids1) || r.Usage.TotalTokens != r.Usage.PromptTokens {
		t.Fatalf("response shape: %s", b)
	}
	// The vectors are the embedder's, normalized to unit length.
	want, err := e.Embed(context.Background(), [][]int32{ids0, ids1})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range r.Data {
		if len(d.Embedding) != 64 || math.Abs(unitNorm(d.Embedding)-1) > 1e-5 {
			t.Fatalf("data[%d]: width %d norm %v", i, len(d.Embedding), unitNorm(d.Embedding))
		}
		n := unitNorm(want[i])
		for j, x := range d.Embedding {
			if math.Abs(float64(x)-float64(want[i][j])/n) > 1e-6 {
				t.Fatalf("data[%d][%d] = %v, want %v", i, j, x, float64(want[i][j])/n)
			}
		}
	}
	floats := r.Data[0].Embedding

	// A string, token ids and arrays of token ids give the same vector.
	idsJSON := strings.ReplaceAll(fmt.Sprint(ids0), " ", ",")
	for _, in := range []string{`"the cat sat on the mat."`, idsJSON, "[" + idsJSON + "]"} {
		code, b := post(t, ts, "/v1/embeddings", `{"input":`+in+`}`)
		if code != 200 {
			t.Fatalf("input %s: %d %s", in, code, b)
		}
		if got := decode[resp](t, b).Data[0].Embedding; !slices.Equal(got, floats) {
			t.Fatalf("input %s: a different vector", in)
		}
	}

	// base64 decodes to the same float32 values.
	code, b = post(t, ts, "/v1/embeddings", `{"input":"the cat sat on the mat.","encoding_format":"base64"}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	rb := decode[struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}](t, b)
	raw, err := base64.StdEncoding.DecodeString(rb.Data[0].Embedding)
	if err != nil || len(raw) != 4*64 {
		t.Fatalf("base64: %v, %d bytes", err, len(raw))
	}
	for j := range floats {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); got != floats[j] {
			t.Fatalf("base64 [%d] = %v, float %v", j, got, floats[j])
		}
	}

	// dimensions shortens and renormalizes.
	code, b = post(t, ts, "/v1/embeddings", `{"input":"the cat sat on the mat.","dimensions":16}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	short := decode[resp](t, b).Data[0].Embedding
	if len(short) != 16 || math.Abs(unitNorm(short)-1) > 1e-5 {
		t.Fatalf("dimensions 16: width %d norm %v", len(short), unitNorm(short))
	}
	n16 := unitNorm(floats[:16])
	for j := range short {
		if math.Abs(float64(short[j])-float64(floats[j])/n16) > 1e-6 {
			t.Fatalf("dimensions 16: [%d] = %v", j, short[j])
		}
	}
}

var tokOpts = tokenizerOptions()

func TestEmbeddingsErrors(t *testing.T) {
	ts, _, _ := embedServer(t)
	long := strings.Repeat("cat ", 200)
	for _, c := range []struct{ body, param, msg string }{
		{`{"input":""}`, "input", "empty string"},
		{`{"input":[]}`, "input", "empty array"},
		{`{"input":["a",""]}`, "input", "input[1] is an empty string"},
		{`{}`, "input", "required"},
		{`{"input":[[]]}`, "input", "empty array of token ids"},
		{`{"input":[1,99999]}`, "input", "out of range"},
		{`{"input":[1.5]}`, "input", "integer"},
		{`{"input":{"a":1}}`, "input", "must be a string"},
		{`{"input":"` + long + `"}`, "input", "maximum context length is 128"},
		{`{"input":"a","dimensions":65}`, "dimensions", "want 1 to 64"},
		{`{"input":"a","dimensions":0}`, "dimensions", "want 1 to 64"},
		{`{"input":"a","encoding_format":"int8"}`, "encoding_format", "float or base64"},
	} {
		code, b := post(t, ts, "/v1/embeddings", c.body)
		e := decode[errBody](t, b)
		if code != 400 || e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%.60s: %d %s", c.body, code, b)
		}
	}
	// An encoder does not generate, and says so.
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":2}`)
	if code != 400 || !strings.Contains(string(b), "embedding model") {
		t.Errorf("completion on an encoder: %d %s", code, b)
	}
	code, b = post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || !strings.Contains(string(b), "embedding model") {
		t.Errorf("chat on an encoder: %d %s", code, b)
	}
	// Still healthy.
	if code, b := post(t, ts, "/v1/embeddings", `{"input":"a"}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
}

func TestEmbeddingsNoEmbedder(t *testing.T) {
	ts := startServer(t, newFake(), Options{})
	for _, p := range []string{"/v1/embeddings", "/api/embed", "/api/embeddings"} {
		code, b := post(t, ts, p, `{"input":"a","prompt":"a"}`)
		if code != 400 || !strings.Contains(string(b), "does not compute embeddings") {
			t.Errorf("%s: %d %s", p, code, b)
		}
	}
}

func TestOllamaEmbed(t *testing.T) {
	ts, _, _ := embedServer(t)
	type resp struct {
		Model           string      `json:"model"`
		Embeddings      [][]float32 `json:"embeddings"`
		TotalDuration   int64       `json:"total_duration"`
		PromptEvalCount int         `json:"prompt_eval_count"`
	}
	code, b := post(t, ts, "/api/embed", `{"model":"bert","input":["the cat sat on the mat.","she was happy"]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	r := decode[resp](t, b)
	if r.Model != "bert" || len(r.Embeddings) != 2 || len(r.Embeddings[0]) != 64 || r.PromptEvalCount == 0 || r.TotalDuration <= 0 {
		t.Fatalf("shape: %s", b)
	}
	for _, v := range r.Embeddings {
		if math.Abs(unitNorm(v)-1) > 1e-5 {
			t.Fatalf("norm %v", unitNorm(v))
		}
	}
	// A single string gives an array of one array; the same vector as
	// OpenAI's endpoint.
	code, b = post(t, ts, "/api/embed", `{"input":"she was happy"}`)
	one := decode[resp](t, b)
	if code != 200 || len(one.Embeddings) != 1 || !slices.Equal(one.Embeddings[0], r.Embeddings[1]) {
		t.Fatalf("single input: %d %s", code, b)
	}

	// Too long: truncated by default (to the model's 128 positions, the
	// closing [SEP] kept), an error with truncate false.
	long := strings.Repeat("cat ", 200)
	code, b = post(t, ts, "/api/embed", `{"input":"`+long+`"}`)
	if code != 200 || decode[resp](t, b).PromptEvalCount != 128 {
		t.Fatalf("truncate default: %d %.200s", code, b)
	}
	code, b = post(t, ts, "/api/embed", `{"input":"`+long+`","truncate":false}`)
	oe := decode[struct {
		Error string `json:"error"`
	}](t, b)
	if code != 400 || !strings.Contains(oe.Error, "maximum context length") {
		t.Fatalf("truncate false: %d %s", code, b)
	}
	// options.num_ctx lowers the truncation point.
	code, b = post(t, ts, "/api/embed", `{"input":"`+long+`","options":{"num_ctx":16}}`)
	if code != 200 || decode[resp](t, b).PromptEvalCount != 16 {
		t.Fatalf("num_ctx 16: %d %.200s", code, b)
	}
	for _, body := range []string{`{"input":[]}`, `{"input":""}`, `{"input":3}`, `{"input":"a","dimensions":65}`} {
		if code, b := post(t, ts, "/api/embed", body); code != 400 || !strings.Contains(string(b), `"error":`) {
			t.Errorf("%s: %d %s", body, code, b)
		}
	}

	// The legacy endpoint: one prompt, unnormalized.
	code, b = post(t, ts, "/api/embeddings", `{"model":"bert","prompt":"she was happy"}`)
	leg := decode[struct {
		Embedding []float32 `json:"embedding"`
	}](t, b)
	if code != 200 || len(leg.Embedding) != 64 {
		t.Fatalf("legacy: %d %s", code, b)
	}
	n := unitNorm(leg.Embedding)
	for j, x := range leg.Embedding {
		if math.Abs(float64(x)/n-float64(r.Embeddings[1][j])) > 1e-6 {
			t.Fatalf("legacy [%d] normalized %v, /api/embed %v", j, float64(x)/n, r.Embeddings[1][j])
		}
	}
	if code, _ := post(t, ts, "/api/embeddings", `{"model":"bert"}`); code != 400 {
		t.Fatalf("legacy without prompt: %d", code)
	}
}

func tokenizerOptions() tokenizer.Options {
	return tokenizer.Options{AddSpecial: true, ParseSpecial: true}
}
