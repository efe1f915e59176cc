package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"pagoda/quant"
)

// maxNameLen is ggml's GGML_MAX_NAME less the terminating NUL; llama.cpp
// refuses longer tensor names.
const maxNameLen = 63

// Writer builds a GGUF file: metadata in insertion order, then the tensor
// directory and the tensor data, each tensor aligned.
type Writer struct {
	version   uint32
	alignment int
	kv        []KV
	kvIndex   map[string]int
	tensors   []wtensor
	names     map[string]bool
	err       error // deferred from SetAlignment, which cannot return one
}

type wtensor struct {
	name string
	typ  quant.Type
	dims []uint64
	size int
	data []byte
	fn   func(io.Writer) error
}

// NewWriter returns a Writer for a version 3 file with alignment 32.
func NewWriter() *Writer {
	return &Writer{
		version:   3,
		alignment: DefaultAlignment,
		kvIndex:   map[string]int{},
		names:     map[string]bool{},
	}
}

// SetVersion selects GGUF version 2 or 3 (the encodings are identical).
func (w *Writer) SetVersion(v uint32) error {
	if v != 2 && v != 3 {
		return fmt.Errorf("gguf: cannot write version %d (only 2 and 3)", v)
	}
	w.version = v
	return nil
}

// SetAlignment sets the tensor data alignment, a power of two. A value other
// than 32 is also recorded as general.alignment, as readers require. An
// invalid value makes WriteTo fail.
func (w *Writer) SetAlignment(n int) {
	if n <= 0 || n&(n-1) != 0 || n > 1<<30 {
		w.err = fmt.Errorf("gguf: alignment %d is not a power of two", n)
		return
	}
	_, present := w.kvIndex[KeyAlignment]
	if n != DefaultAlignment || present {
		w.setValue(KeyAlignment, Value{Type: Uint32, V: uint32(n)})
	}
	w.alignment = n
}

// Set adds or replaces a metadata entry; a replaced key keeps its position.
// v may be a Value, a Go scalar (every integer width, float32/64, bool,
// string) or a typed slice of those ([]Value for arrays of arrays). Go int
// and uint are stored as int32 and uint32, as gguf-py does, and must fit.
// general.alignment must be a uint32 power of two and sets the alignment.
func (w *Writer) Set(key string, v any) error {
	val, err := ToValue(v)
	if err != nil {
		return fmt.Errorf("gguf: key %q: %w", key, err)
	}
	if key == KeyAlignment {
		a, ok := val.V.(uint32)
		if !ok {
			return fmt.Errorf("gguf: key %q: type %s, want uint32", key, val.Type)
		}
		if a == 0 || a&(a-1) != 0 || a > 1<<30 {
			return fmt.Errorf("gguf: key %q: %d is not a power of two", key, a)
		}
		w.alignment = int(a)
	}
	w.setValue(key, val)
	return nil
}

func (w *Writer) setValue(key string, v Value) {
	if i, ok := w.kvIndex[key]; ok {
		w.kv[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kv)
	w.kv = append(w.kv, KV{Key: key, Value: v})
}

// AddTensor appends a tensor. data must hold exactly the bytes that type t
// and dims (ggml order, dims[0] the row length) imply; it is not copied and
// must stay valid until the file is written.
func (w *Writer) AddTensor(name string, t quant.Type, dims []uint64, data []byte) error {
	size, err := w.checkTensor(name, t, dims)
	if err != nil {
		return err
	}
	if len(data) != size {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, %s %v needs %d", name, len(data), t, dims, size)
	}
	w.addTensor(wtensor{name: name, typ: t, dims: dims, size: size, data: data})
	return nil
}

// AddTensorFunc appends a tensor whose size bytes are produced by fn when
// the file is written, so large models can be streamed one tensor at a
// time. size must match type t and dims; WriteTo fails if fn writes a
// different number of bytes.
func (w *Writer) AddTensorFunc(name string, t quant.Type, dims []uint64, size int, fn func(io.Writer) error) error {
	want, err := w.checkTensor(name, t, dims)
	if err != nil {
		return err
	}
	if size != want {
		return fmt.Errorf("gguf: tensor %q: size %d given, %s %v needs %d", name, size, t, dims, want)
	}
	if fn == nil {
		return fmt.Errorf("gguf: tensor %q: nil data function", name)
	}
	w.addTensor(wtensor{name: name, typ: t, dims: dims, size: size, fn: fn})
	return nil
}

func (w *Writer) checkTensor(name string, t quant.Type, dims []uint64) (int, error) {
	if name == "" {
		return 0, fmt.Errorf("gguf: tensor with an empty name")
	}
	if len(name) > maxNameLen {
		return 0, fmt.Errorf("gguf: tensor %q: name longer than %d bytes", name, maxNameLen)
	}
	if w.names[name] {
		return 0, fmt.Errorf("gguf: tensor %q added twice", name)
	}
	if !t.Known() {
		return 0, fmt.Errorf("gguf: tensor %q: unknown type id %d", name, uint32(t))
	}
	if len(dims) == 0 || len(dims) > maxDims {
		return 0, fmt.Errorf("gguf: tensor %q: %d dimensions (want 1 to %d)", name, len(dims), maxDims)
	}
	size, err := tensorSize(t, dims)
	if err != nil {
		return 0, fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	return size, nil
}

func (w *Writer) addTensor(t wtensor) {
	t.dims = append([]uint64(nil), t.dims...)
	w.names[t.name] = true
	w.tensors = append(w.tensors, t)
}

// countWriter counts the bytes passed to the underlying writer.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteTo writes the whole file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	cw := &countWriter{w: out}
	bw := bufio.NewWriterSize(cw, 1<<20)
	var hdr bytes.Buffer
	le := binary.LittleEndian
	hdr.WriteString(Magic)
	hdr.Write(le.AppendUint32(nil, w.version))
	hdr.Write(le.AppendUint64(nil, uint64(len(w.tensors))))
	hdr.Write(le.AppendUint64(nil, uint64(len(w.kv))))
	for _, kv := range w.kv {
		putString(&hdr, kv.Key)
		hdr.Write(le.AppendUint32(nil, uint32(kv.Value.Type)))
		if err := encodeValue(&hdr, kv.Value); err != nil {
			return 0, fmt.Errorf("gguf: key %q: %w", kv.Key, err)
		}
	}
	align := uint64(w.alignment)
	var off uint64
	for _, t := range w.tensors {
		putString(&hdr, t.name)
		hdr.Write(le.AppendUint32(nil, uint32(len(t.dims))))
		for _, d := range t.dims {
			hdr.Write(le.AppendUint64(nil, d))
		}
		hdr.Write(le.AppendUint32(nil, uint32(t.typ)))
		hdr.Write(le.AppendUint64(nil, off))
		off = alignUp(off+uint64(t.size), align)
	}
	if len(w.tensors) > 0 {
		pad(&hdr, uint64(hdr.Len()), align)
	}
	if _, err := bw.Write(hdr.Bytes()); err != nil {
		return cw.n, fmt.Errorf("gguf: %w", err)
	}
	for _, t := range w.tensors {
		if t.fn != nil {
			tc := &countWriter{w: bw}
			if err := t.fn(tc); err != nil {
				return cw.n, fmt.Errorf("gguf: tensor %q: %w", t.name, err)
			}
			if tc.n != int64(t.size) {
				return cw.n, fmt.Errorf("gguf: tensor %q: data function wrote %d bytes, want %d", t.name, tc.n, t.size)
			}
		} else if _, err := bw.Write(t.data); err != nil {
			return cw.n, fmt.Errorf("gguf: tensor %q: %w", t.name, err)
		}
		if err := pad(bw, uint64(t.size), align); err != nil {
			return cw.n, fmt.Errorf("gguf: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return cw.n, fmt.Errorf("gguf: %w", err)
	}
	return cw.n, nil
}

var zeros [256]byte

// pad writes the zero bytes that take n to the next multiple of align.
func pad(w io.Writer, n, align uint64) error {
	k := alignUp(n, align) - n
	for k > 0 {
		c := min(k, uint64(len(zeros)))
		if _, err := w.Write(zeros[:c]); err != nil {
			return err
		}
		k -= c
	}
	return nil
}

// WriteFile writes the file to path through a temporary file in the same
// folder, so a failed write never leaves a truncated model behind.
func (w *Writer) WriteFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	// CreateTemp makes the file 0600; a model file is as readable as any
	// other file the user writes (umask applies to neither, so use 0644).
	werr := tmp.Chmod(0o644)
	if werr == nil {
		_, werr = w.WriteTo(tmp)
	}
	cerr := tmp.Close()
	if werr == nil && cerr != nil {
		werr = fmt.Errorf("gguf: %s: %w", path, cerr)
	}
	if werr == nil {
		if err := os.Rename(tmp.Name(), path); err != nil {
			werr = fmt.Errorf("gguf: %w", err)
		}
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return werr
	}
	return nil
}

func putString(b *bytes.Buffer, s string) {
	b.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(s))))
	b.WriteString(s)
}

// ToValue converts a Go value to a metadata Value (see Writer.Set) and
// checks that a given Value is consistent.
func ToValue(v any) (Value, error) {
	switch x := v.(type) {
	case Value:
		return x, checkValue(x, 0)
	case uint8:
		return Value{Type: Uint8, V: x}, nil
	case int8:
		return Value{Type: Int8, V: x}, nil
	case uint16:
		return Value{Type: Uint16, V: x}, nil
	case int16:
		return Value{Type: Int16, V: x}, nil
	case uint32:
		return Value{Type: Uint32, V: x}, nil
	case int32:
		return Value{Type: Int32, V: x}, nil
	case uint64:
		return Value{Type: Uint64, V: x}, nil
	case int64:
		return Value{Type: Int64, V: x}, nil
	case float32:
		return Value{Type: Float32, V: x}, nil
	case float64:
		return Value{Type: Float64, V: x}, nil
	case bool:
		return Value{Type: Bool, V: x}, nil
	case string:
		return Value{Type: String, V: x}, nil
	case int:
		if x < math.MinInt32 || x > math.MaxInt32 {
			return Value{}, fmt.Errorf("int %d does not fit int32 (pass an int64)", x)
		}
		return Value{Type: Int32, V: int32(x)}, nil
	case uint:
		if x > math.MaxUint32 {
			return Value{}, fmt.Errorf("uint %d does not fit uint32 (pass a uint64)", x)
		}
		return Value{Type: Uint32, V: uint32(x)}, nil
	case []int:
		a := make([]int32, len(x))
		for i, e := range x {
			if e < math.MinInt32 || e > math.MaxInt32 {
				return Value{}, fmt.Errorf("element %d: int %d does not fit int32", i, e)
			}
			a[i] = int32(e)
		}
		return Value{Type: Array, Elem: Int32, V: a}, nil
	case []Value:
		val := Value{Type: Array, Elem: Array, V: x}
		return val, checkValue(val, 0)
	}
	if et, ok := sliceElem(v); ok {
		return Value{Type: Array, Elem: et, V: v}, nil
	}
	return Value{}, fmt.Errorf("cannot store Go type %T", v)
}

// sliceElem returns the element type of a typed slice accepted as an array.
func sliceElem(v any) (ValueType, bool) {
	switch v.(type) {
	case []uint8:
		return Uint8, true
	case []int8:
		return Int8, true
	case []uint16:
		return Uint16, true
	case []int16:
		return Int16, true
	case []uint32:
		return Uint32, true
	case []int32:
		return Int32, true
	case []uint64:
		return Uint64, true
	case []int64:
		return Int64, true
	case []float32:
		return Float32, true
	case []float64:
		return Float64, true
	case []bool:
		return Bool, true
	case []string:
		return String, true
	case []Value:
		return Array, true
	}
	return 0, false
}

// scalarType returns the value type of a Go scalar of an exact GGUF type.
func scalarType(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return Uint8, true
	case int8:
		return Int8, true
	case uint16:
		return Uint16, true
	case int16:
		return Int16, true
	case uint32:
		return Uint32, true
	case int32:
		return Int32, true
	case uint64:
		return Uint64, true
	case int64:
		return Int64, true
	case float32:
		return Float32, true
	case float64:
		return Float64, true
	case bool:
		return Bool, true
	case string:
		return String, true
	}
	return 0, false
}

func checkValue(v Value, depth int) error {
	if depth > maxNesting {
		return fmt.Errorf("arrays nested deeper than %d", maxNesting)
	}
	if v.Type != Array {
		st, ok := scalarType(v.V)
		if !ok || st != v.Type {
			return fmt.Errorf("value of Go type %T does not match GGUF type %s", v.V, v.Type)
		}
		return nil
	}
	et, ok := sliceElem(v.V)
	if !ok || et != v.Elem {
		return fmt.Errorf("array value of Go type %T does not match element type %s", v.V, v.Elem)
	}
	if sub, ok := v.V.([]Value); ok {
		for i, e := range sub {
			if e.Type != Array {
				return fmt.Errorf("element %d of an array of arrays has type %s", i, e.Type)
			}
			if err := checkValue(e, depth+1); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
	}
	return nil
}

func encodeValue(b *bytes.Buffer, v Value) error {
	if err := checkValue(v, 0); err != nil {
		return err
	}
	encodeChecked(b, v)
	return nil
}

// encodeChecked encodes a Value that checkValue accepted.
func encodeChecked(b *bytes.Buffer, v Value) {
	le := binary.LittleEndian
	var p [8]byte
	switch x := v.V.(type) {
	case uint8:
		b.WriteByte(x)
	case int8:
		b.WriteByte(byte(x))
	case bool:
		if x {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case uint16:
		b.Write(le.AppendUint16(p[:0], x))
	case int16:
		b.Write(le.AppendUint16(p[:0], uint16(x)))
	case uint32:
		b.Write(le.AppendUint32(p[:0], x))
	case int32:
		b.Write(le.AppendUint32(p[:0], uint32(x)))
	case float32:
		b.Write(le.AppendUint32(p[:0], math.Float32bits(x)))
	case uint64:
		b.Write(le.AppendUint64(p[:0], x))
	case int64:
		b.Write(le.AppendUint64(p[:0], uint64(x)))
	case float64:
		b.Write(le.AppendUint64(p[:0], math.Float64bits(x)))
	case string:
		putString(b, x)
	default:
		n, _ := arrayLen(v.V)
		b.Write(le.AppendUint32(p[:0], uint32(v.Elem)))
		b.Write(le.AppendUint64(p[:0], uint64(n)))
		switch a := v.V.(type) {
		case []uint8:
			b.Write(a)
		case []string:
			for _, s := range a {
				putString(b, s)
			}
		case []Value:
			for _, e := range a {
				encodeChecked(b, e)
			}
		default:
			for i := 0; i < n; i++ {
				encodeChecked(b, Value{V: elemAt(v.V, i)})
			}
		}
	}
}

// elemAt returns element i of a fixed-size typed slice.
func elemAt(a any, i int) any {
	switch a := a.(type) {
	case []int8:
		return a[i]
	case []uint16:
		return a[i]
	case []int16:
		return a[i]
	case []uint32:
		return a[i]
	case []int32:
		return a[i]
	case []uint64:
		return a[i]
	case []int64:
		return a[i]
	case []float32:
		return a[i]
	case []float64:
		return a[i]
	case []bool:
		return a[i]
	}
	return nil
}
