package server

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"pagoda/engine"
	"pagoda/model"
	"pagoda/testutil"
)

// TestRealModelGreedy serves the real stories260K model over HTTP and
// checks greedy decoding from BOS against the reference run, for several
// concurrent requests and n = 2 (continuous batching and shared prompt
// blocks must not change greedy output).
func TestRealModelGreedy(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	refPath := testutil.Shared(t, "models/llama2.c/stories260K.reference.json")
	var ref struct {
		Greedy struct {
			Tokens []int32 `json:"tokens"`
		} `json:"greedy"`
	}
	b, err := os.ReadFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	steps := 128
	if testing.Short() {
		steps = 32
	}
	m, eng := storiesEngine(t, path, nil)
	c := m.Config
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", c.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	defer ts.Close()
	want := m.Tokenizer().Decode(ref.Greedy.Tokens[1 : 1+steps])

	body := `{"prompt":[1],"max_tokens":` + itoa(steps) + `,"temperature":0,"ignore_eos":true,"n":2}`
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, b := post(t, ts, "/v1/completions", body)
			if code != 200 {
				t.Errorf("%d %s", code, b)
				return
			}
			r := decode[complResp](t, b)
			for _, ch := range r.Choices {
				if ch.Text != want {
					t.Errorf("choice %d:\n got %q\nwant %q", ch.Index, ch.Text, want)
				}
			}
			if r.Usage.CompletionTokens != 2*steps || r.Usage.PromptTokens != 1 {
				t.Errorf("usage %+v", r.Usage)
			}
		}()
	}
	wg.Wait()
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// storiesEngine opens the stories260K file at path and runs an engine over
// it, with edit adjusting the serving limits; both end with the test.
func storiesEngine(t *testing.T, path string, edit func(*engine.Config)) (*model.Model, *engine.Engine) {
	t.Helper()
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cfg := engine.ModelConfig(m, "stories260K")
	if edit != nil {
		edit(&cfg)
	}
	eng, err := engine.New(m, m.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	t.Cleanup(func() { eng.Stop(context.Background()) })
	return m, eng
}
