package eval

import (
	"strings"
	"testing"
)

// FuzzKVList: any --kv value is split and parsed without a panic; a list
// that splits re-splits to the same configurations when joined again,
// none of them empty or beginning with a setting; a list that parses gives
// one configuration per piece, named as written, each of which parses
// alone and makes its policy.
func FuzzKVList(f *testing.F) {
	for _, s := range []string{
		"f16,q8_0,q4_0,kivi4,kivi2",
		"streaming:sinks=4,window=2+snapkv:capacity=40",
		"f16,streaming:sinks=4,window=256,q8_0",
		"kv:k=q4_0,v=q8_0+block:n=32",
		"f16+f32", "f16,f16", "kivi2:r=-1", "quest:", "f16,,x", "r=1,f16", "h2o:heavy=0.1,recent=0.1+kivi4:g=16,r=16",
		"minicache:from=2,channels:r=4", "streaming:sinks=4,sinks=5", " f16 , F16 ",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pieces, err := SplitList(s)
		if err != nil {
			if _, perr := ParseList([]string{s}); perr == nil {
				t.Fatalf("%q: SplitList failed (%v) but ParseList did not", s, err)
			}
			return
		}
		for _, p := range pieces {
			head, _, _ := strings.Cut(p, "+")
			if p == "" || p != strings.TrimSpace(p) || (strings.Contains(head, "=") && !strings.Contains(head, ":")) {
				t.Fatalf("%q: bad piece %q in %q", s, p, pieces)
			}
		}
		again, err := SplitList(strings.Join(pieces, ","))
		if err != nil || strings.Join(again, "\x00") != strings.Join(pieces, "\x00") {
			t.Fatalf("%q: split %q, joined and split again %q (%v)", s, pieces, again, err)
		}
		cfgs, err := ParseList([]string{s})
		if err != nil {
			return
		}
		if len(cfgs) != len(pieces) {
			t.Fatalf("%q: %d pieces, %d configurations", s, len(pieces), len(cfgs))
		}
		for i, c := range cfgs {
			if c.Name != pieces[i] {
				t.Fatalf("%q: configuration %d named %q, piece %q", s, i, c.Name, pieces[i])
			}
			if _, err := Parse(c.Name); err != nil {
				t.Fatalf("%q: %q parsed in the list but not alone: %v", s, c.Name, err)
			}
			if c.Setup.Policy != nil && c.Setup.Policy() == nil {
				t.Fatalf("%q: %q made a nil policy", s, c.Name)
			}
		}
	})
}
