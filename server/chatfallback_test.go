package server

import (
	"net/http/httptest"
	"strings"
	"testing"
)

type fakeFallback struct{ *fakeBackend }

func (fakeFallback) ChatTemplateInfo() ChatTemplate {
	return ResolveChatTemplate("", nil)
}

// TestChatFallbackAnnounced: a model without a template chats through
// ChatML, every chat endpoint says so in a header, and ChatML's end of
// turn stops generation.
func TestChatFallbackAnnounced(t *testing.T) {
	f := newFake()
	f.script = "ok"
	f.ctxLen = 512
	ts := httptest.NewServer(New(fakeFallback{f}, Options{}).Handler())
	t.Cleanup(ts.Close)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stop":"x"}`},
		{"/api/chat", `{"model":"fake-model","stream":false,"messages":[{"role":"user","content":"hi"}],"options":{"stop":["x"]}}`},
		{"/v1/messages", `{"model":"fake-model","max_tokens":5,"stop_sequences":["x"],"messages":[{"role":"user","content":"hi"}]}`},
	} {
		resp, err := ts.Client().Post(ts.URL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Pagoda-Chat-Template") != TemplateFallback {
			t.Fatalf("%s: %d %q", c.path, resp.StatusCode, resp.Header.Get("X-Pagoda-Chat-Template"))
		}
		if got := f.lastReq(t).StopStrings; strings.Join(got, "|") != "x|<|im_end|>" {
			t.Fatalf("%s: stops %q", c.path, got)
		}
	}
	ct := ResolveChatTemplate("", nil)
	if ct.FallbackNote() == "" || ResolveChatTemplate("{{ x }}", nil).Kind != TemplateCustom {
		t.Fatal("resolution")
	}
}
