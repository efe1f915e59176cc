package server

import "testing"

// TestSpecTokensParam maps the spec_tokens body field onto the engine
// request: absent keeps the server's setting, 0 turns speculation off.
func TestSpecTokensParam(t *testing.T) {
	l := limits{maxN: 4, maxLogprobs: 5}
	for _, c := range []struct {
		in   *int
		want int
		bad  bool
	}{{nil, 0, false}, {ptr(0), -1, false}, {ptr(3), 3, false}, {ptr(-2), 0, true}} {
		p := commonParams{SpecTokens: c.in}
		r, ae := p.toEngine(l)
		if c.bad {
			if ae == nil {
				t.Errorf("spec_tokens %d accepted", *c.in)
			}
			continue
		}
		if ae != nil || r.SpecTokens != c.want {
			t.Errorf("spec_tokens %v: %+v, %v; want %d", c.in, r, ae, c.want)
		}
	}
}

func ptr(v int) *int { return &v }
