package gguf

import (
	"bytes"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser. Besides never panicking,
// anything it accepts must survive a rewrite: writing the parsed file and
// parsing it again gives the same bytes when written once more.
func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	if _, err := allTypesWriter(f).WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(header(3, 0, 0))
	f.Add(header(2, 1, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse(b)
		if err != nil {
			return
		}
		checkParsed(t, g, len(b))
		w1, ok := fuzzRewrite(g)
		if !ok {
			return
		}
		h, err := Parse(w1)
		if err != nil {
			t.Fatalf("rewrite does not parse: %v", err)
		}
		w2, ok := fuzzRewrite(h)
		if !ok || !bytes.Equal(w1, w2) {
			t.Fatalf("second rewrite differs (ok=%v)", ok)
		}
	})
}

// fuzzRewrite writes f again; false when the Writer refuses what the
// reader tolerates (long tensor names).
func fuzzRewrite(f *File) ([]byte, bool) {
	w := NewWriter()
	if w.SetVersion(f.Version) != nil {
		return nil, false
	}
	for _, kv := range f.KV {
		if w.Set(kv.Key, kv.Value) != nil {
			return nil, false
		}
	}
	for _, ti := range f.Tensors {
		if w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data) != nil {
			return nil, false
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}
