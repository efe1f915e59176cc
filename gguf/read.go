package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"unsafe"

	"pagoda/mmapfile"
	"pagoda/quant"
)

// maxDims is ggml's GGML_MAX_DIMS.
const maxDims = 4

// maxNesting bounds arrays of arrays; real files never nest, and the bound
// keeps a hostile file from driving deep recursion.
const maxNesting = 16

// Open maps the file at path and parses it. The returned File must be
// closed to release the mapping.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s: not a regular file", path)
	}
	size := st.Size()
	if size < 4 {
		return nil, fmt.Errorf("gguf: %s: file is %d bytes, too short for a GGUF header", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("gguf: %s: file of %d bytes does not fit in memory on this platform", path, size)
	}
	b, unmap, err := mmapfile.Map(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f, err := parse(b)
	if err != nil {
		unmap()
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f.unmap = unmap
	f.mapped = b
	// The metadata is decoded into Go values: its pages need not stay.
	f.Release(b[:min(f.DataOffset, size)])
	return f, nil
}

// Parse parses a GGUF file held in memory. Tensor Data slices alias b.
func Parse(b []byte) (*File, error) {
	f, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	return f, nil
}

var errShort = errors.New("unexpected end of file")

// reader decodes little-endian GGUF fields from b, never reading past its
// end.
type reader struct {
	b   []byte
	off int
}

func (r *reader) remaining() int { return len(r.b) - r.off }

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, fmt.Errorf("at offset %d: need %d bytes, %d left: %w", r.off, n, r.remaining(), errShort)
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) u8() (uint8, error) {
	p, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

func (r *reader) u16() (uint16, error) {
	p, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(p), nil
}

func (r *reader) u32() (uint32, error) {
	p, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (r *reader) u64() (uint64, error) {
	p, err := r.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

// clip shortens a key or tensor name read from a possibly corrupt file for
// an error message: a bad length can make a "name" of kilobytes.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func (r *reader) str() (string, error) {
	n, err := r.u64()
	if err != nil {
		return "", err
	}
	if n > uint64(r.remaining()) {
		return "", fmt.Errorf("at offset %d: string of %d bytes, only %d left: %w", r.off-8, n, r.remaining(), errShort)
	}
	p, _ := r.take(int(n))
	return string(p), nil
}

// count reads an element count and checks that count elements of at least
// minSize bytes each can still fit in the file.
func (r *reader) count(minSize int) (int, error) {
	at := r.off
	n, err := r.u64()
	if err != nil {
		return 0, err
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(r.remaining()/minSize) {
		return 0, fmt.Errorf("at offset %d: count %d cannot fit in the %d bytes left: %w", at, n, r.remaining(), errShort)
	}
	return int(n), nil
}

func parse(b []byte) (*File, error) {
	r := &reader{b: b}
	magic, err := r.take(4)
	if err != nil {
		return nil, err
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("bad magic %q, not a GGUF file", magic)
	}
	version, err := r.u32()
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, fmt.Errorf("GGUF version 1 is not supported (re-convert the model)")
	case version&0xFFFF == 0 && bits.ReverseBytes32(version) <= 3:
		return nil, fmt.Errorf("big-endian GGUF (version %d) is not supported", bits.ReverseBytes32(version))
	default:
		return nil, fmt.Errorf("unsupported GGUF version %d", version)
	}
	// Each tensor info is at least name length + n_dims + type + offset.
	nTensors, err := r.count(8 + 4 + 4 + 8)
	if err != nil {
		return nil, fmt.Errorf("tensor count: %w", err)
	}
	// Each KV is at least key length + value type + a 1-byte value.
	nKV, err := r.count(8 + 4 + 1)
	if err != nil {
		return nil, fmt.Errorf("metadata count: %w", err)
	}

	f := &File{
		Version:     version,
		KV:          make([]KV, 0, nKV),
		kvIndex:     make(map[string]int, nKV),
		Alignment:   DefaultAlignment,
		tensorIndex: make(map[string]*TensorInfo, nTensors),
	}
	for i := 0; i < nKV; i++ {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("metadata entry %d: key: %w", i, err)
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, fmt.Errorf("metadata key %q appears twice", clip(key))
		}
		vt, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("metadata %q: %w", clip(key), err)
		}
		v, err := r.value(ValueType(vt), 0)
		if err != nil {
			return nil, fmt.Errorf("metadata %q: %w", clip(key), err)
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	if v, ok := f.Get(KeyAlignment); ok {
		a, isU32 := v.V.(uint32)
		if !isU32 {
			return nil, fmt.Errorf("%s has type %s, want uint32", KeyAlignment, v.Type)
		}
		if a == 0 || a&(a-1) != 0 || a > 1<<30 {
			return nil, fmt.Errorf("%s = %d is not a power of two", KeyAlignment, a)
		}
		f.Alignment = int(a)
	}

	f.Tensors = make([]*TensorInfo, 0, nTensors)
	for i := 0; i < nTensors; i++ {
		t, err := r.tensorInfo()
		if err != nil {
			if t != nil && t.Name != "" {
				return nil, fmt.Errorf("tensor %q: %w", clip(t.Name), err)
			}
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		if _, dup := f.tensorIndex[t.Name]; dup {
			return nil, fmt.Errorf("tensor %q appears twice", clip(t.Name))
		}
		f.tensorIndex[t.Name] = t
		f.Tensors = append(f.Tensors, t)
	}

	// The data section starts at the next multiple of the alignment; a file
	// without tensors may end before it.
	start := alignUp(uint64(r.off), uint64(f.Alignment))
	f.DataOffset = int64(start)
	for _, t := range f.Tensors {
		if t.Offset%uint64(f.Alignment) != 0 {
			return nil, fmt.Errorf("tensor %q: offset %d is not a multiple of the alignment %d", clip(t.Name), t.Offset, f.Alignment)
		}
		if t.Size == 0 {
			t.Data = []byte{}
			continue
		}
		end := start + t.Offset + uint64(t.Size)
		if t.Offset > uint64(len(b)) || end < start || end > uint64(len(b)) {
			return nil, fmt.Errorf("tensor %q: data [%d, %d) lies beyond the end of the file (%d bytes): %w",
				clip(t.Name), start+t.Offset, start+t.Offset+uint64(t.Size), len(b), errShort)
		}
		lo := int(start + t.Offset)
		t.Data = b[lo : lo+t.Size : lo+t.Size]
	}
	return f, nil
}

func (r *reader) tensorInfo() (*TensorInfo, error) {
	t := &TensorInfo{}
	name, err := r.str()
	if err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	t.Name = name
	nd, err := r.u32()
	if err != nil {
		return t, err
	}
	if nd == 0 || nd > maxDims {
		return t, fmt.Errorf("%d dimensions (want 1 to %d)", nd, maxDims)
	}
	t.Dims = make([]uint64, nd)
	elems := uint64(1)
	for j := range t.Dims {
		d, err := r.u64()
		if err != nil {
			return t, err
		}
		t.Dims[j] = d
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64 {
			return t, fmt.Errorf("dimensions %v overflow", t.Dims[:j+1])
		}
		elems = lo
	}
	typ, err := r.u32()
	if err != nil {
		return t, err
	}
	t.Type = quant.Type(typ)
	if !t.Type.Known() {
		return t, fmt.Errorf("unknown tensor type id %d", typ)
	}
	if t.Offset, err = r.u64(); err != nil {
		return t, err
	}
	size, err := tensorSize(t.Type, t.Dims)
	if err != nil {
		return t, err
	}
	t.Size = size
	return t, nil
}

// tensorSize is the byte size of a tensor of type typ and dims (ggml order),
// with every overflow reported.
func tensorSize(typ quant.Type, dims []uint64) (int, error) {
	if len(dims) == 0 {
		return 0, fmt.Errorf("no dimensions")
	}
	bs := uint64(typ.BlockSize())
	if bs == 0 {
		return 0, fmt.Errorf("unknown tensor type id %d", uint32(typ))
	}
	if dims[0]%bs != 0 {
		return 0, fmt.Errorf("type %s: row length %d is not a multiple of the block size %d", typ, dims[0], bs)
	}
	hi, size := bits.Mul64(dims[0]/bs, uint64(typ.TypeSize()))
	if hi != 0 {
		return 0, fmt.Errorf("dimensions %v overflow", dims)
	}
	for _, d := range dims[1:] {
		hi, size = bits.Mul64(size, d)
		if hi != 0 {
			return 0, fmt.Errorf("dimensions %v overflow", dims)
		}
	}
	if size > math.MaxInt {
		return 0, fmt.Errorf("dimensions %v: %d bytes do not fit in memory", dims, size)
	}
	return int(size), nil
}

func alignUp(n, a uint64) uint64 {
	return (n + a - 1) / a * a
}

func (r *reader) value(t ValueType, depth int) (Value, error) {
	if !t.valid() {
		return Value{}, fmt.Errorf("unknown value type %d", uint32(t))
	}
	if t != Array {
		v, err := r.scalar(t)
		return Value{Type: t, V: v}, err
	}
	if depth >= maxNesting {
		return Value{}, fmt.Errorf("arrays nested deeper than %d", maxNesting)
	}
	et, err := r.u32()
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if !elem.valid() {
		return Value{}, fmt.Errorf("array of unknown value type %d", et)
	}
	n, err := r.count(elem.minSize())
	if err != nil {
		return Value{}, fmt.Errorf("array of %s: %w", elem, err)
	}
	v := Value{Type: Array, Elem: elem}
	switch elem {
	case String:
		a := make([]string, n)
		for i := range a {
			if a[i], err = r.str(); err != nil {
				return Value{}, fmt.Errorf("element %d: %w", i, err)
			}
		}
		v.V = a
	case Array:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = r.value(Array, depth+1); err != nil {
				return Value{}, fmt.Errorf("element %d: %w", i, err)
			}
		}
		v.V = a
	default:
		p, err := r.take(n * elem.fixedSize())
		if err != nil {
			return Value{}, err
		}
		v.V = decodeFixedArray(elem, p, n)
	}
	return v, nil
}

func (r *reader) scalar(t ValueType) (any, error) {
	switch t {
	case String:
		return r.str()
	case Uint8, Int8, Bool:
		x, err := r.u8()
		if err != nil {
			return nil, err
		}
		switch t {
		case Int8:
			return int8(x), nil
		case Bool:
			// Lenient like ggml: any non-zero byte is true.
			return x != 0, nil
		}
		return x, nil
	case Uint16, Int16:
		x, err := r.u16()
		if err != nil {
			return nil, err
		}
		if t == Int16 {
			return int16(x), nil
		}
		return x, nil
	case Uint32, Int32, Float32:
		x, err := r.u32()
		if err != nil {
			return nil, err
		}
		switch t {
		case Int32:
			return int32(x), nil
		case Float32:
			return math.Float32frombits(x), nil
		}
		return x, nil
	case Uint64, Int64, Float64:
		x, err := r.u64()
		if err != nil {
			return nil, err
		}
		switch t {
		case Int64:
			return int64(x), nil
		case Float64:
			return math.Float64frombits(x), nil
		}
		return x, nil
	}
	return nil, fmt.Errorf("unknown value type %d", uint32(t))
}

// decodeFixedArray decodes n fixed-size elements of type t from p (which
// holds exactly n*t.fixedSize() bytes).
func decodeFixedArray(t ValueType, p []byte, n int) any {
	le := binary.LittleEndian
	switch t {
	case Uint8:
		return append([]uint8(nil), p...)
	case Int8:
		a := make([]int8, n)
		for i := range a {
			a[i] = int8(p[i])
		}
		return a
	case Bool:
		a := make([]bool, n)
		for i := range a {
			a[i] = p[i] != 0
		}
		return a
	case Uint16:
		a := make([]uint16, n)
		for i := range a {
			a[i] = le.Uint16(p[2*i:])
		}
		return a
	case Int16:
		a := make([]int16, n)
		for i := range a {
			a[i] = int16(le.Uint16(p[2*i:]))
		}
		return a
	case Uint32:
		a := make([]uint32, n)
		for i := range a {
			a[i] = le.Uint32(p[4*i:])
		}
		return a
	case Int32:
		a := make([]int32, n)
		for i := range a {
			a[i] = int32(le.Uint32(p[4*i:]))
		}
		return a
	case Float32:
		a := make([]float32, n)
		for i := range a {
			a[i] = math.Float32frombits(le.Uint32(p[4*i:]))
		}
		return a
	case Uint64:
		a := make([]uint64, n)
		for i := range a {
			a[i] = le.Uint64(p[8*i:])
		}
		return a
	case Int64:
		a := make([]int64, n)
		for i := range a {
			a[i] = int64(le.Uint64(p[8*i:]))
		}
		return a
	case Float64:
		a := make([]float64, n)
		for i := range a {
			a[i] = math.Float64frombits(le.Uint64(p[8*i:]))
		}
		return a
	}
	return nil
}

// Release lets the resident pages under b, a tensor's Data from this file,
// go once the caller has copied what it needs from them (Linux; elsewhere
// a no-op). b stays readable: its pages come back from the file (usually
// the page cache) if read again. Bytes outside the file's mapping, or a
// File from Parse, are left alone.
func (f *File) Release(b []byte) {
	if len(b) == 0 || len(f.mapped) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(&f.mapped[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(f.mapped)) {
		return
	}
	mmapfile.Release(b)
}
