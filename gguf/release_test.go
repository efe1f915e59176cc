package gguf

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"pagoda/quant"
)

// Release drops a tensor's resident pages but not its contents: the bytes
// read back the same, from the file. Slices from elsewhere are ignored.
func TestRelease(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	w := NewWriter()
	if err := w.AddTensor("t", quant.F32, []uint64{uint64(len(data) / 4)}, data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "r.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	td := f.Tensor("t").Data
	if !bytes.Equal(td, data) {
		t.Fatal("tensor data differs before release")
	}
	f.Release(td)
	f.Release(td[1000:5000]) // within one or two pages: nothing whole to drop
	if !bytes.Equal(td, data) {
		t.Fatal("tensor data differs after release")
	}
	heap := append([]byte(nil), data...)
	f.Release(heap) // not the file's: left alone
	if !bytes.Equal(heap, data) {
		t.Fatal("Release changed memory outside the file's mapping")
	}
	p, err := Parse(append([]byte(nil), mustRead(t, path)...))
	if err != nil {
		t.Fatal(err)
	}
	pd := p.Tensor("t").Data
	p.Release(pd) // a parsed File has no mapping: left alone
	if !bytes.Equal(pd, data) {
		t.Fatal("Release changed a parsed file's memory")
	}
}

func mustRead(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
