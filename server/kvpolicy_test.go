package server

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"pagoda/engine"
	"pagoda/kvcache"
	"pagoda/testutil"
)

// TestKVPolicyField: kv_policy in both forms, on both endpoints, reaches
// the engine request as the policy ParsePolicy makes of the same string;
// bad input is a 400 naming kv_policy, and the server goes on serving.
func TestKVPolicyField(t *testing.T) {
	f := newFake()
	ts := startServer(t, f, Options{})
	good := []struct{ field, want string }{
		{`"quest:budget=1024"`, "quest:budget=1024,dense=2"},
		{`{"name":"quest","budget":1024}`, "quest:budget=1024,dense=2"},
		{`{"name":"Quest","budget":64,"dense":0}`, "quest:budget=64,dense=0"},
		{`{"name":"h2o","heavy":0.1,"recent":"0.2"}`, "h2o:heavy=0.1,recent=0.2"},
		{`{"name":"snapkv","capacity":512,"window":16}`, "snapkv:capacity=512,window=16,kernel=7"},
		{`{"name":"streaming","sinks":4,"window":256}`, "streaming:sinks=4,window=256"},
		{`"streaming:sinks=4,window=256,pos=shift,ctx=1024"`, "streaming:sinks=4,window=256,pos=shift,ctx=1024"},
		{`{"name":"streaming","pos":"shift","ctx":1024}`, "streaming:sinks=4,window=256,pos=shift,ctx=1024"},
		{`"none"`, "full"},
		{`{"name":"none"}`, "full"},
		{`null`, ""},
	}
	for _, ep := range []struct{ path, body string }{
		{"/v1/completions", `"prompt":"hi"`},
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`},
	} {
		for _, c := range good {
			code, b := post(t, ts, ep.path, `{`+ep.body+`,"max_tokens":2,"kv_policy":`+c.field+`}`)
			if code != 200 {
				t.Fatalf("%s kv_policy %s: %d %s", ep.path, c.field, code, b)
			}
			got := ""
			if spec := f.lastReq(t).KVPolicy; spec != "" {
				p, err := kvcache.ParsePolicy(spec)
				if err != nil {
					t.Fatalf("%s kv_policy %s: the engine gets %q, which does not parse: %v", ep.path, c.field, spec, err)
				}
				got = kvcache.PolicyName(p)
			}
			if got != c.want {
				t.Errorf("%s kv_policy %s: engine got %q, want %q", ep.path, c.field, got, c.want)
			}
		}
		for _, c := range []struct{ field, msg string }{
			{`"lru"`, "unknown policy"},
			{`{"name":"lru"}`, "unknown policy"},
			{`{"name":"quest","budgett":5}`, "unknown setting budgett"},
			{`"quest:budgett=5"`, "unknown setting budgett"},
			{`{"name":"quest","budget":-5}`, "budget"},
			{`{"name":"quest","budget":0}`, "budget"},
			{`{"name":"quest","budget":1.5}`, "budget"},
			{`{"name":"quest","budget":1e300}`, "budget"},
			{`{"name":"streaming","window":0}`, "window"},
			{`{"name":"h2o","heavy":-1}`, "heavy"},
			{`{"name":"h2o","heavy":0.6,"recent":0.6}`, "h2o"},
			{`{"name":"snapkv","capacity":4,"window":8}`, "snapkv"},
			{`{"name":"quest","budget":true}`, "number or a string"},
			{`{"name":"quest","budget":[1]}`, "number or a string"},
			{`{"name":"quest","budget":"1,dense=0"}`, "bad value"},
			{`{"name":"quest","a,b":1}`, "bad setting"},
			{`{"budget":1024}`, "name"},
			{`{"name":5}`, "name"},
			{`{"name":"quest:budget=5"}`, "bad policy name"},
			{`""`, "empty"},
			{`5`, "must be a string"},
			{`true`, "must be a string"},
			{`["quest"]`, "must be a string"},
			{`"quest:budget"`, "key=value"},
		} {
			code, b := post(t, ts, ep.path, `{`+ep.body+`,"max_tokens":2,"kv_policy":`+c.field+`}`)
			var e struct {
				Error struct {
					Message, Type string
					Param         *string
				}
			}
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("%s kv_policy %s: %d %s", ep.path, c.field, code, b)
			}
			if code != 400 || e.Error.Param == nil || *e.Error.Param != "kv_policy" || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("%s kv_policy %s: %d %s (want 400 naming kv_policy, saying %q)", ep.path, c.field, code, b, c.msg)
			}
		}
	}
	if code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":2}`); code != 200 {
		t.Fatalf("after the bad requests: %d %s", code, b)
	}
}

// TestKVPolicyRealModel: on an engine whose --kv-policy is Quest, a
// request with kv_policy "none" generates what a plain server does and one
// with Quest what the Quest server does, run together; a policy the
// engine refuses is a 400 naming kv_policy.
func TestKVPolicyRealModel(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	serve := func(def kvcache.Policy) *httptest.Server {
		m, eng := storiesEngine(t, path, func(c *engine.Config) {
			c.KVPolicy, c.BlockSize, c.KVDType = def, 8, kvcache.F32
		})
		be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(New(be, Options{}).Handler())
		t.Cleanup(ts.Close)
		return ts
	}
	quest, _ := kvcache.ParsePolicy("quest:budget=16,dense=2")
	text := func(ts *httptest.Server, field string) string {
		t.Helper()
		body := `{"prompt":"Once upon a time there was a little girl","max_tokens":48,"temperature":0,"ignore_eos":true` + field + `}`
		code, b := post(t, ts, "/v1/completions", body)
		if code != 200 {
			t.Fatalf("%s: %d %s", field, code, b)
		}
		return decode[complResp](t, b).Choices[0].Text
	}
	plain, questText := text(serve(nil), ""), text(serve(quest), "")
	if plain == questText {
		t.Fatal("quest changes nothing here: the test proves nothing")
	}
	ts := serve(quest)
	res := make(chan [2]string, 2)
	for _, field := range []string{`,"kv_policy":"none"`, `,"kv_policy":{"name":"quest","budget":16}`} {
		go func() { res <- [2]string{field, text(ts, field)} }()
	}
	for range 2 {
		r := <-res
		want := plain
		if strings.Contains(r[0], "quest") {
			want = questText
		}
		if r[1] != want {
			t.Errorf("%s beside the other: %q, want %q", r[0], r[1], want)
		}
	}
	code, b := post(t, ts, "/v1/completions", `{"prompt":"hi","max_tokens":2,"kv_policy":"window:w=5"}`)
	if code != 400 || !strings.Contains(string(b), `"param":"kv_policy"`) {
		t.Fatalf("a window the model does not have: %d %s", code, b)
	}
}

// TestKVPolicyRefusals (issue 24, item 7): on the real model (context
// 512) a setting given twice, a ':' with no settings, an unknown setting
// and counts past the context are 400s naming kv_policy and saying what
// is wrong; the same policies within bounds generate.
func TestKVPolicyRefusals(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	m, eng := storiesEngine(t, path, func(c *engine.Config) { c.BlockSize, c.KVDType = 8, kvcache.F32 })
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{}).Handler())
	t.Cleanup(ts.Close)
	ctx := itoa(m.Config.ContextLen)
	for _, c := range []struct{ field, msg string }{
		{`"quest:budget=1,budget=2"`, "setting budget given twice"},
		{`"quest:"`, "a ':' with no settings after it"},
		{`"streaming:sinks=100000,window=1"`, "sinks + window is 100001 tokens, more than the context of " + ctx + " (want at most " + ctx + ")"},
		{`"snapkv:capacity=1000000000"`, "the capacity is 1000000000 tokens, more than the context of " + ctx},
		{`{"name":"quest","budget":100000}`, "the budget is 100000 tokens"},
		{`"window:size=8"`, "unknown setting size (window takes w)"},
	} {
		for _, ep := range []struct{ path, body string }{
			{"/v1/completions", `"prompt":"hi"`},
			{"/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`},
		} {
			code, b := post(t, ts, ep.path, `{`+ep.body+`,"max_tokens":2,"kv_policy":`+c.field+`}`)
			if code != 400 || !strings.Contains(string(b), `"param":"kv_policy"`) || !strings.Contains(string(b), c.msg) {
				t.Errorf("%s kv_policy %s: %d %s, want 400 with %q", ep.path, c.field, code, b, c.msg)
			}
		}
	}
	for _, field := range []string{`"quest:budget=` + ctx + `"`, `"streaming:sinks=4,window=60"`, `"snapkv:capacity=64"`} {
		if code, b := post(t, ts, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":4,"kv_policy":`+field+`}`); code != 200 {
			t.Errorf("kv_policy %s: %d %s", field, code, b)
		}
	}
}

// FuzzKVPolicyField: the kv_policy parser never panics; what it accepts
// is a policy whose settings pass its own check, and its string form
// parses back to the same policy.
func FuzzKVPolicyField(f *testing.F) {
	for _, s := range []string{`"quest:budget=1024"`, `{"name":"quest","budget":1024}`, `{"name":"h2o","heavy":0.1,"recent":0.1}`,
		`"none"`, `{"name":"streaming","sinks":4,"window":256,"pos":"shift","ctx":1024}`, `{"name":"snapkv","capacity":64,"window":8,"kernel":3}`, `5`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		spec, ae := parseKVPolicy(raw)
		if ae != nil {
			if ae.Param != "kv_policy" || ae.Status != 400 {
				t.Fatalf("%s: %+v", raw, ae)
			}
			return
		}
		if spec == "" {
			return
		}
		p, err := kvcache.ParsePolicy(spec)
		if err != nil {
			t.Fatalf("%s: accepted %q, which does not parse: %v", raw, spec, err)
		}
		if ck, ok := p.(interface{ Check() error }); ok {
			if err := ck.Check(); err != nil {
				t.Fatalf("%s: accepted %v failing its check: %v", raw, p, err)
			}
		}
		back, err := kvcache.ParsePolicy(kvcache.PolicyName(p))
		if err != nil || kvcache.PolicyName(back) != kvcache.PolicyName(p) {
			t.Fatalf("%s: %q parses back as %v, %v", raw, kvcache.PolicyName(p), back, err)
		}
	})
}
