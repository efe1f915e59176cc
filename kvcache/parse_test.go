package kvcache

import (
	"strings"
	"testing"
)

// TestParsePolicyRefusals (issue 24, item 7): a setting given twice, a
// ':' with no settings and an unknown setting are refused, the last
// naming the policy's known settings before any range check on them.
func TestParsePolicyRefusals(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"quest:budget=1,budget=2", `setting budget given twice`},
		{"quest:", `a ':' with no settings after it (write quest alone for its defaults)`},
		{"streaming: ", `a ':' with no settings`},
		{"window:size=8", `unknown setting size (window takes w)`},
		{"quest:budget=64,denst=2", `unknown setting denst (quest takes budget, dense)`},
		{"snapkv:cap=64", `unknown setting cap (snapkv takes capacity, window, kernel)`},
		{"streaming:sink=4", `unknown setting sink (streaming takes sinks, window, pos, ctx)`},
		{"streaming:window=8,ctx=100", `ctx is the cache of a context shift; it needs pos=shift`},
		{"full:x=1", `unknown setting x (full takes no settings)`},
		{"h2o:heavy=0.1,recent=0.1,Heavy=0.2", `setting heavy given twice`},
	} {
		_, err := ParsePolicy(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParsePolicy(%q): %v, want %q", c.in, err, c.want)
		}
	}
	if err := Configure(&Config{NLayer: 4, NKVHead: 1, HeadDim: 8, DType: F32}, "minicache:from=1,from=2"); err == nil || !strings.Contains(err.Error(), "from given twice") {
		t.Errorf("minicache with from twice: %v", err)
	}
	if err := Configure(&Config{NLayer: 4, NKVHead: 1, HeadDim: 8, DType: F32}, "minicache:frm=1"); err == nil || !strings.Contains(err.Error(), "unknown setting frm (minicache takes from, t, retain, spare)") {
		t.Errorf("minicache with frm: %v", err)
	}
}

// TestCheckContext: token counts past the context are refused with the
// bound; counts within it, fractions and a context of 0 pass.
func TestCheckContext(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" = fits a context of 512
	}{
		{"streaming:sinks=100000,window=1", "sinks + window is 100001 tokens, more than the context of 512 (want at most 512)"},
		{"snapkv:capacity=1000000000", "the capacity is 1000000000 tokens, more than the context of 512"},
		{"quest:budget=513", "the budget is 513 tokens"},
		{"h2o:heavy=300,recent=300", "heavy + recent is 600 tokens"},
		{"h2o:heavy=600,recent=0.1", "heavy is 600 tokens"},
		{"streaming:sinks=4,window=8,pos=shift,ctx=1024", "the shifted cache (ctx) is 1024 tokens"},
		{"streaming:sinks=4,window=508", ""},
		{"snapkv:capacity=512", ""},
		{"h2o:heavy=0.5,recent=0.4", ""},
		{"quest:budget=64", ""},
		{"full", ""},
	} {
		p, err := ParsePolicy(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		err = CheckContext(p, 512)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckContext(%s, 512): %v, want %q", c.in, err, c.want)
		}
		if err := CheckContext(p, 0); err != nil {
			t.Errorf("CheckContext(%s, 0): %v", c.in, err)
		}
	}
}
