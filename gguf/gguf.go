// Package gguf reads and writes GGUF files (versions 2 and 3), the ggml
// container for model metadata and tensors.
//
// Reading maps the file into memory where the platform allows it, so tensor
// Data slices are views into the mapping and stay valid until Close. Every
// count and length in the file is checked against the bytes that remain
// before anything is allocated, so a corrupt file yields an error, never a
// panic or a huge allocation.
package gguf

import (
	"io"
	"math"
	"os"

	"pagoda/quant"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the tensor data alignment used when a file does not
// carry general.alignment.
const DefaultAlignment = 32

// KeyAlignment is the metadata key that overrides DefaultAlignment.
const KeyAlignment = "general.alignment"

// ValueType is the GGUF metadata value type id.
type ValueType uint32

// Metadata value types, numbered as in the GGUF specification.
const (
	Uint8   ValueType = 0
	Int8    ValueType = 1
	Uint16  ValueType = 2
	Int16   ValueType = 3
	Uint32  ValueType = 4
	Int32   ValueType = 5
	Float32 ValueType = 6
	Bool    ValueType = 7
	String  ValueType = 8
	Array   ValueType = 9
	Uint64  ValueType = 10
	Int64   ValueType = 11
	Float64 ValueType = 12
)

var valueTypeNames = [...]string{
	Uint8: "uint8", Int8: "int8", Uint16: "uint16", Int16: "int16",
	Uint32: "uint32", Int32: "int32", Float32: "float32", Bool: "bool",
	String: "string", Array: "array", Uint64: "uint64", Int64: "int64",
	Float64: "float64",
}

// String returns the specification name of the type.
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "valuetype(" + itoa(uint64(t)) + ")"
}

// valid reports whether t is a defined value type.
func (t ValueType) valid() bool { return t <= Float64 }

// fixedSize is the encoded size of a scalar of type t, 0 for strings and
// arrays (variable length).
func (t ValueType) fixedSize() int {
	switch t {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16:
		return 2
	case Uint32, Int32, Float32:
		return 4
	case Uint64, Int64, Float64:
		return 8
	}
	return 0
}

// minSize is the smallest possible encoding of one value of type t; it
// bounds array counts by the bytes that remain.
func (t ValueType) minSize() int {
	switch t {
	case String:
		return 8 // length prefix
	case Array:
		return 12 // element type + count
	}
	return t.fixedSize()
}

// Value is one metadata value.
//
// V holds, for scalars, the Go value of the matching type (uint8, int8,
// uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64). For arrays Type is Array, Elem the element type and V the typed
// slice ([]uint8 … []float64, []bool, []string); arrays of arrays hold
// []Value.
type Value struct {
	Type ValueType
	Elem ValueType
	V    any
}

// KV is one metadata entry, in file order.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of the directory.
type TensorInfo struct {
	Name string
	// Dims are in ggml order: Dims[0] is the row length (the contiguous
	// dimension).
	Dims []uint64
	Type quant.Type
	// Offset is relative to the start of the data section.
	Offset uint64
	// Size is the byte size implied by Type and Dims.
	Size int
	// Data views the tensor's bytes inside the file mapping; valid until
	// File.Close.
	Data []byte
}

// Elements returns the number of elements (the product of Dims).
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Rows returns the number of rows: the product of Dims[1:].
func (t *TensorInfo) Rows() uint64 {
	n := uint64(1)
	for _, d := range t.Dims[1:] {
		n *= d
	}
	return n
}

// File is a parsed GGUF file.
type File struct {
	Version uint32
	KV      []KV
	Tensors []*TensorInfo
	// Alignment of the tensor data (general.alignment or 32).
	Alignment int
	// DataOffset is the file offset of the data section.
	DataOffset int64

	kvIndex     map[string]int
	tensorIndex map[string]*TensorInfo
	unmap       func() error
	// mapped is the file's mapping when Open made one (Release advises
	// it); nil for Parse.
	mapped []byte
}

// Close releases the file mapping; tensor Data slices must not be used
// afterwards. Closing a File from Parse, or closing twice, is harmless.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	u := f.unmap
	f.unmap, f.mapped = nil, nil
	return u()
}

// Get returns the value of key.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	v, ok := f.Get(key)
	if !ok || v.Type != String {
		return "", false
	}
	s, ok := v.V.(string)
	return s, ok
}

// Uint returns an integer value of any integer type when it is not negative.
func (f *File) Uint(key string) (uint64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.Uint()
}

// Int returns an integer value of any integer type when it fits an int64.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.Int()
}

// Float returns a float or integer value as float64.
func (f *File) Float(key string) (float64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	v, ok := f.Get(key)
	if !ok || v.Type != Bool {
		return false, false
	}
	b, ok := v.V.(bool)
	return b, ok
}

// Strings returns a string array.
func (f *File) Strings(key string) ([]string, bool) {
	v, ok := f.Get(key)
	if !ok || v.Type != Array {
		return nil, false
	}
	s, ok := v.V.([]string)
	return s, ok
}

// Float32s returns a float array as float32 (float64 arrays are converted).
func (f *File) Float32s(key string) ([]float32, bool) {
	v, ok := f.Get(key)
	if !ok || v.Type != Array {
		return nil, false
	}
	switch a := v.V.(type) {
	case []float32:
		return a, true
	case []float64:
		out := make([]float32, len(a))
		for i, x := range a {
			out[i] = float32(x)
		}
		return out, true
	}
	return nil, false
}

// Int32s returns an array of any integer type as int32; false when an
// element does not fit.
func (f *File) Int32s(key string) ([]int32, bool) {
	v, ok := f.Get(key)
	if !ok || v.Type != Array {
		return nil, false
	}
	if a, ok := v.V.([]int32); ok {
		return a, true
	}
	n, ok := arrayLen(v.V)
	if !ok {
		return nil, false
	}
	out := make([]int32, n)
	for i := range out {
		x, ok := intAt(v.V, i)
		if !ok || x < math.MinInt32 || x > math.MaxInt32 {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

// Tensor returns the named tensor, nil when absent.
func (f *File) Tensor(name string) *TensorInfo {
	return f.tensorIndex[name]
}

// Uint returns v as uint64 when it is an integer of any width and not
// negative.
func (v Value) Uint() (uint64, bool) {
	switch x := v.V.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Int returns v as int64 when it is an integer that fits.
func (v Value) Int() (int64, bool) {
	switch x := v.V.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	}
	return 0, false
}

// Float returns v as float64 when it is a float or an integer.
func (v Value) Float() (float64, bool) {
	switch x := v.V.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	if u, ok := v.Uint(); ok {
		return float64(u), true
	}
	return 0, false
}

// Len returns the number of elements of an array value, 0 for scalars.
func (v Value) Len() int {
	if v.Type != Array {
		return 0
	}
	n, _ := arrayLen(v.V)
	return n
}

func arrayLen(a any) (int, bool) {
	switch a := a.(type) {
	case []uint8:
		return len(a), true
	case []int8:
		return len(a), true
	case []uint16:
		return len(a), true
	case []int16:
		return len(a), true
	case []uint32:
		return len(a), true
	case []int32:
		return len(a), true
	case []uint64:
		return len(a), true
	case []int64:
		return len(a), true
	case []float32:
		return len(a), true
	case []float64:
		return len(a), true
	case []bool:
		return len(a), true
	case []string:
		return len(a), true
	case []Value:
		return len(a), true
	}
	return 0, false
}

// intAt returns element i of an integer slice as int64 (false for other
// slices and uint64 values above MaxInt64).
func intAt(a any, i int) (int64, bool) {
	switch a := a.(type) {
	case []uint8:
		return int64(a[i]), true
	case []int8:
		return int64(a[i]), true
	case []uint16:
		return int64(a[i]), true
	case []int16:
		return int64(a[i]), true
	case []uint32:
		return int64(a[i]), true
	case []int32:
		return int64(a[i]), true
	case []int64:
		return a[i], true
	case []uint64:
		return int64(a[i]), a[i] <= math.MaxInt64
	}
	return 0, false
}

func itoa(u uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			return string(b[i:])
		}
	}
}

// IsGGUF reports whether the file at path starts with the GGUF magic, so
// callers can pick a reader by content rather than by file name.
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [len(Magic)]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false
	}
	return string(b[:]) == Magic
}
