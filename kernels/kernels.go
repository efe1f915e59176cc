// Package kernels is the math on slices: matrix products per weight type,
// normalisation, rotary embeddings, softmax and activation functions.
//
// Every exported function has a plain Go reference implementation (the
// *Ref functions in ref.go); SIMD versions are chosen at start-up by CPU
// feature and tested against the references.
package kernels

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"pagoda/quant"
)

// Matrix is a 2-D weight in its stored format: Rows rows of Cols elements,
// row-major, each row quant.RowSize(Type, Cols) bytes of Data.
type Matrix struct {
	Type       quant.Type
	Rows, Cols int
	Data       []byte
	RowBytes   int

	// pk caches the SIMD layout of Data (*packed), built on first use or by
	// Prepack. A plain pointer, not atomic.Pointer, so that Matrix values
	// may still be copied (the copy shares the cache, which is immutable).
	pk unsafe.Pointer
}

// NewMatrix describes data as a rows×cols matrix of type t.
func NewMatrix(t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	rb, err := quant.RowSize(t, cols)
	if err != nil {
		return nil, err
	}
	if rows < 0 || len(data) < rows*rb {
		return nil, fmt.Errorf("kernels: %s matrix %d×%d needs %d bytes, have %d", t, rows, cols, rows*rb, len(data))
	}
	return &Matrix{Type: t, Rows: rows, Cols: cols, Data: data, RowBytes: rb}, nil
}

// Row returns the stored bytes of row i.
func (m *Matrix) Row(i int) []byte { return m.Data[i*m.RowBytes : (i+1)*m.RowBytes] }

// packedOf returns the cached packed layout of m, building it when absent.
func (m *Matrix) packedOf() *packed {
	if p := atomic.LoadPointer(&m.pk); p != nil {
		return (*packed)(p)
	}
	pk := pack(nil, m)
	atomic.StorePointer(&m.pk, unsafe.Pointer(pk))
	return pk
}

// Prepack builds the SIMD layout of m now, across the pool, instead of on
// the first MatMul. Loaders call it so that the first forward pass is not
// slowed by packing. It is a no-op for types without a packed layout or
// when the active instruction set does not use one.
func Prepack(p *Pool, m *Matrix) {
	if atomic.LoadPointer(&m.pk) != nil || !usesPacked() {
		return
	}
	atomic.StorePointer(&m.pk, unsafe.Pointer(pack(p, m)))
}
