package generate

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"pagoda/model"
	"pagoda/sample"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

func openStories(t *testing.T) *model.Model {
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

type reference struct {
	Greedy struct {
		Tokens []int32 `json:"tokens"`
		Text   string  `json:"text"`
	} `json:"greedy"`
	TeacherForced struct {
		Text       string  `json:"text"`
		Perplexity float64 `json:"perplexity"`
	} `json:"teacher_forced"`
}

func loadRef(t *testing.T) *reference {
	b, err := os.ReadFile(testutil.Shared(t, "models/llama2.c/stories260K.reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r reference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestGreedyMatchesReference(t *testing.T) {
	m := openStories(t)
	ref := loadRef(t)
	var streamed strings.Builder
	res, err := Generate(context.Background(), m, m.Tokenizer(), []int32{1}, Options{MaxTokens: 256, IgnoreEOS: true, PrefillChunk: 7},
		func(tk Token) error { streamed.WriteString(tk.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range res.Tokens {
		if id != ref.Greedy.Tokens[i+1] {
			t.Fatalf("token %d: %d, want %d", i, id, ref.Greedy.Tokens[i+1])
		}
	}
	if res.Text != streamed.String() {
		t.Errorf("result text and streamed text differ")
	}
	if want := m.Tokenizer().Decode(ref.Greedy.Tokens); res.Text != want {
		t.Errorf("text %q\nwant %q", res.Text, want)
	}
}

func TestStopStringAndLength(t *testing.T) {
	m := openStories(t)
	tok := m.Tokenizer()
	prompt := []int32{1, 403, 407, 261, 378} // "Once upon a time"
	res, err := Generate(context.Background(), m, tok, prompt, Options{MaxTokens: 50, StopStrings: []string{"girl"}}, func(Token) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != "stop" || res.Text != ", there was a little " {
		t.Errorf("stop: reason %s, text %q", res.FinishReason, res.Text)
	}
	res, err = Generate(context.Background(), m, tok, prompt, Options{MaxTokens: 5}, func(Token) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != "length" || len(res.Tokens) != 5 {
		t.Errorf("length: reason %s, %d tokens", res.FinishReason, len(res.Tokens))
	}
}

func TestSeededSamplingIsDeterministic(t *testing.T) {
	m := openStories(t)
	o := Options{MaxTokens: 40, Sampling: sample.Params{Temperature: 1, TopP: 0.9, Seed: 42, HasSeed: true}}
	run := func() []int32 {
		res, err := Generate(context.Background(), m, m.Tokenizer(), []int32{1}, o, func(Token) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	a, b := run(), run()
	if len(a) != len(b) {
		t.Fatalf("lengths %d, %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed diverged at %d", i)
		}
	}
}

func TestScoreMatchesReference(t *testing.T) {
	m := openStories(t)
	ref := loadRef(t)
	ids := m.Tokenizer().Encode(ref.TeacherForced.Text, tokenizerOpts())
	sc, err := ScoreTokens(m, ids, false, 8)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(sc.Perplexity-ref.TeacherForced.Perplexity) > 1e-3 {
		t.Errorf("perplexity %.6f, want %.6f", sc.Perplexity, ref.TeacherForced.Perplexity)
	}
}

func TestBadInput(t *testing.T) {
	m := openStories(t)
	if _, err := Generate(context.Background(), m, m.Tokenizer(), nil, Options{}, nil); err == nil {
		t.Error("empty prompt accepted")
	}
	if _, err := Generate(context.Background(), m, m.Tokenizer(), []int32{1}, Options{Sampling: sample.Params{TopP: 2}}, nil); err == nil {
		t.Error("top_p 2 accepted")
	}
	if _, err := Generate(context.Background(), m, m.Tokenizer(), []int32{1, 9999}, Options{}, func(Token) error { return nil }); err == nil {
		t.Error("out-of-vocabulary token accepted")
	}
	long := make([]int32, m.Config.ContextLen+1)
	if _, err := ScoreTokens(m, long, false, 0); err == nil {
		t.Error("over-long text scored")
	}
}

func tokenizerOpts() tokenizer.Options { return tokenizer.Options{AddSpecial: true} }
