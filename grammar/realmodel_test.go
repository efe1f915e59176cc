package grammar_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"pagoda/embedded"
	"pagoda/engine"
	"pagoda/grammar"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// storySchemas are what TestStoriesSchemas samples: nested objects, enums,
// arrays, numbers. Strings are bounded so that a story model, which has no
// reason to close a quote, still ends within max_tokens.
var storySchemas = []string{
	`{"type":"object","properties":{
		"name":{"type":"string","maxLength":12},
		"age":{"type":"integer","minimum":1,"maximum":12},
		"pet":{"enum":["cat","dog","bird"]}},
		"required":["name","age","pet"],"additionalProperties":false}`,
	`{"type":"object","properties":{
		"story":{"type":"object","properties":{
			"title":{"type":"string","minLength":1,"maxLength":16},
			"mood":{"anyOf":[{"const":"happy"},{"const":"sad"},{"type":"null"}]},
			"scores":{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3}},
			"required":["title","scores"]},
		"done":{"type":"boolean"}},
		"required":["story","done"]}`,
	`{"$defs":{"char":{"type":"object","properties":{"name":{"type":"string","maxLength":10},"kind":{"enum":["girl","boy","cat"]}},"required":["name","kind"]}},
	  "type":"array","items":{"$ref":"#/$defs/char"},"minItems":1,"maxItems":3}`,
	`{"type":"object","properties":{"x":{"type":"number"},"y":{"type":["integer","null"]},"words":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":4}},"required":["x","y","words"]}`,
}

func openStories(t testing.TB) (*model.Model, *engine.Engine) {
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	eng, err := engine.New(m, m.Tokenizer(), engine.ModelConfig(m, "stories260K"))
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	t.Cleanup(func() { eng.Stop(context.Background()) })
	return m, eng
}

// TestStoriesSchemas samples 200 completions at temperature 1 with
// different seeds from the real stories260K model, n = 10 per request (each
// completion with its own matcher), and requires every one to end on its
// own (EOS, forced once the document is complete), parse with
// encoding/json and validate against its schema.
func TestStoriesSchemas(t *testing.T) {
	m, eng := openStories(t)
	tok := m.Tokenizer()
	prompt := tok.Encode("Once upon a time", tokenizer.Options{AddSpecial: true})
	const perRequest, requests = 10, 5
	var mu sync.Mutex
	var total, tokens int
	var wg sync.WaitGroup
	for si, s := range storySchemas {
		for r := range requests {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &engine.Request{
					ID: fmt.Sprintf("s%d-r%d", si, r), Prompt: prompt, N: perRequest, MaxTokens: 400,
					Sampling:   sample.Params{Temperature: 1, Seed: uint64(1000*si + 100*r), HasSeed: true},
					Constraint: &grammar.Spec{Kind: grammar.KindJSONSchema, Schema: s},
				}
				ch, err := eng.Submit(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				texts := make([]strings.Builder, perRequest)
				finish := make([]engine.FinishReason, perRequest)
				n := 0
				for ev := range ch {
					if ev.Err != nil {
						t.Errorf("%s: %v", req.ID, ev.Err)
					}
					texts[ev.Index].WriteString(ev.Text)
					n += len(ev.Tokens)
					if ev.Finish != engine.FinishNone {
						finish[ev.Index] = ev.Finish
					}
				}
				for i := range texts {
					if finish[i] != engine.FinishStop {
						t.Errorf("%s/%d: finish %q, text %q", req.ID, i, finish[i], texts[i].String())
						continue
					}
					if err := grammar.ParseAndValidate(texts[i].String(), []byte(s)); err != nil {
						t.Errorf("%s/%d: %v", req.ID, i, err)
					}
				}
				mu.Lock()
				total += perRequest
				tokens += n
				if r == 0 {
					t.Logf("schema %d: %s", si, texts[0].String())
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if total != 200 {
		t.Fatalf("%d completions, want 200", total)
	}
	t.Logf("200 completions, %d tokens, all valid", tokens)
}
