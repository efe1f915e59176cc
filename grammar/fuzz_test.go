package grammar

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// FuzzCompileSchema: any input either fails with a *SchemaError or
// compiles to a grammar whose matcher never dead-ends over a vocabulary of
// all bytes, and every document it completes parses and validates.
func FuzzCompileSchema(f *testing.F) {
	for _, s := range testSchemas {
		f.Add([]byte(s), uint64(1))
	}
	f.Add([]byte(`{"type":"string","pattern":"a"}`), uint64(2))
	f.Add([]byte(`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`), uint64(3))
	f.Add([]byte(`{"oneOf":[{"type":"integer"},{"type":"string","maxLength":0}]}`), uint64(4))
	v := byteVocab()
	f.Fuzz(func(t *testing.T, schema []byte, seed uint64) {
		g, err := CompileSchema(schema)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SchemaError", err)
			}
			return
		}
		m := New(g, v).Matcher()
		r := rand.New(rand.NewPCG(seed, 7))
		logits := make([]float32, v.Size())
		var out []byte
		for range 300 {
			clear(logits)
			if err := m.Mask(logits); err != nil {
				t.Fatalf("%s: after %q: %v", schema, out, err)
			}
			var ok []int32
			for i, l := range logits {
				if !math.IsInf(float64(l), -1) {
					ok = append(ok, int32(i))
				}
			}
			tok := ok[r.IntN(len(ok))]
			for _, id := range ok {
				if v.isEOG[id] || (r.IntN(3) == 0 && strings.ContainsAny(string(v.pieces[id]), `"]}`)) {
					tok = id
					break
				}
			}
			if err := m.Accept(tok); err != nil {
				t.Fatalf("%s: after %q: %v", schema, out, err)
			}
			if m.Done() {
				if err := parseAndValidate(string(out), schema); err != nil {
					t.Fatalf("%s: %v", schema, err)
				}
				return
			}
			out = append(out, v.pieces[tok]...)
		}
	})
}
