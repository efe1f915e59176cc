// Package kernels is the math on slices: matrix products per weight type,
// normalisation, rotary embeddings, softmax and activation functions.
//
// Every exported function has a plain Go reference implementation (the
// *Ref functions in ref.go); SIMD versions are chosen at start-up by CPU
// feature and tested against the references.
package kernels

import "pagoda/quant"

// Matrix is a 2-D weight in its stored format: Rows rows of Cols elements,
// row-major, each row quant.RowSize(Type, Cols) bytes of Data.
type Matrix struct {
	Type       quant.Type
	Rows, Cols int
	Data       []byte
	RowBytes   int
}

// NewMatrix describes data as a rows×cols matrix of type t.
func NewMatrix(t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	rb, err := quant.RowSize(t, cols)
	if err != nil {
		return nil, err
	}
	return &Matrix{Type: t, Rows: rows, Cols: cols, Data: data, RowBytes: rb}, nil
}

// Row returns the stored bytes of row i.
func (m *Matrix) Row(i int) []byte { return m.Data[i*m.RowBytes : (i+1)*m.RowBytes] }
