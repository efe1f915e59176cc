package quant

import (
	"encoding/binary"
	"fmt"
	"os"
)

// A minimal GGUF v2/v3 reader for the golden-file tests. The real reader is
// package gguf, which imports quant, so quant's own tests cannot use it.

type testTensor struct {
	name string
	dims []uint64
	typ  Type
	data []byte
}

func (t *testTensor) elems() int {
	n := 1
	for _, d := range t.dims {
		n *= int(d)
	}
	return n
}

type ggufReader struct {
	b   []byte
	pos int
	err error
}

func (r *ggufReader) take(n int) []byte {
	if r.err != nil {
		return make([]byte, n)
	}
	if n < 0 || r.pos+n > len(r.b) {
		r.err = fmt.Errorf("truncated at %d", r.pos)
		return make([]byte, n)
	}
	s := r.b[r.pos : r.pos+n]
	r.pos += n
	return s
}

func (r *ggufReader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *ggufReader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
func (r *ggufReader) str() string { return string(r.take(int(r.u64()))) }

// value reads one metadata value of type vt, returning it only when it is
// an integer (enough for general.alignment).
func (r *ggufReader) value(vt uint32) uint64 {
	sizes := map[uint32]int{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
	switch vt {
	case 8:
		r.str()
		return 0
	case 9:
		et, n := r.u32(), r.u64()
		for i := uint64(0); i < n && r.err == nil; i++ {
			r.value(et)
		}
		return 0
	}
	sz, ok := sizes[vt]
	if !ok {
		r.err = fmt.Errorf("bad value type %d", vt)
		return 0
	}
	b := r.take(sz)
	var v uint64
	for i := sz - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func readGGUF(path string) (map[string]*testTensor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &ggufReader{b: b}
	if string(r.take(4)) != "GGUF" {
		return nil, fmt.Errorf("%s: not a GGUF file", path)
	}
	if v := r.u32(); v != 2 && v != 3 {
		return nil, fmt.Errorf("%s: GGUF version %d", path, v)
	}
	nt, nkv := r.u64(), r.u64()
	align := uint64(32)
	for i := uint64(0); i < nkv && r.err == nil; i++ {
		key := r.str()
		v := r.value(r.u32())
		if key == "general.alignment" {
			align = v
		}
	}
	type info struct {
		t   *testTensor
		off uint64
	}
	infos := make([]info, 0, nt)
	for i := uint64(0); i < nt && r.err == nil; i++ {
		t := &testTensor{name: r.str()}
		nd := r.u32()
		for j := uint32(0); j < nd; j++ {
			t.dims = append(t.dims, r.u64())
		}
		t.typ = Type(r.u32())
		infos = append(infos, info{t, r.u64()})
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s: %w", path, r.err)
	}
	base := (uint64(r.pos) + align - 1) / align * align
	out := map[string]*testTensor{}
	for _, in := range infos {
		size, err := RowSize(in.t.typ, in.t.elems())
		if err != nil {
			return nil, fmt.Errorf("%s: tensor %q: %w", path, in.t.name, err)
		}
		start := base + in.off
		if start+uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("%s: tensor %q: data past end of file", path, in.t.name)
		}
		in.t.data = b[start : start+uint64(size)]
		out[in.t.name] = in.t
	}
	return out, nil
}
