package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Dequantize expands len(dst) elements of type t from src into dst.
// src must hold at least RowSize(t, len(dst)) bytes.
// PLACEHOLDER: only F32 until the quant package lands.
func Dequantize(t Type, src []byte, dst []float32) error {
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		return nil
	}
	return fmt.Errorf("dequantize: type %s not supported", t)
}
