package server

import (
	"strings"
	"testing"
)

// TestSpecTokensParam maps the spec_tokens body field onto the engine
// request: absent keeps the server's setting, 0 turns speculation off;
// past engine.MaxSpecTokens (65, 1,000,000) is a 400 naming the range
// (issue 24, item 7).
func TestSpecTokensParam(t *testing.T) {
	l := limits{maxN: 4, maxLogprobs: 5}
	for _, c := range []struct {
		in   *int
		want int
		bad  bool
	}{{nil, 0, false}, {ptr(0), -1, false}, {ptr(3), 3, false}, {ptr(64), 64, false}, {ptr(-2), 0, true}, {ptr(65), 0, true}, {ptr(1000000), 0, true}} {
		p := commonParams{SpecTokens: c.in}
		r, ae := p.toEngine(l)
		if c.bad {
			if ae == nil || ae.Param != "spec_tokens" || !strings.Contains(ae.Message, "spec_tokens must be in [0, 64]") {
				t.Errorf("spec_tokens %d: %+v", *c.in, ae)
			}
			continue
		}
		if ae != nil || r.SpecTokens != c.want {
			t.Errorf("spec_tokens %v: %+v, %v; want %d", c.in, r, ae, c.want)
		}
	}
}

func ptr(v int) *int { return &v }
