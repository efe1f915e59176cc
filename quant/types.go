// Package quant holds the ggml tensor types: their block layouts,
// dequantization, reference dot products and quantizers.
//
// Dequantize and Quantize cover F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q8_1, Q2_K … Q6_K, Q8_K, IQ4_NL, IQ4_XS and MXFP4. They follow
// ggml's C expression by expression: Dequantize is bit-identical to ggml's
// to_float, and Quantize reproduces llama-quantize's bytes (checked block
// for block against the golden GGUF files). The VecDot* functions are
// ggml's generic integer dot products against 8-bit activations
// (QuantizeActivations / QuantizeQ8_0 / QuantizeQ8_K), in ggml's order of
// float32 operations, as the reference for SIMD kernels.
package quant

import "fmt"

// Type is a ggml tensor type id, as stored in GGUF files.
type Type uint32

// The ggml type ids (ggml.h). The numbering has holes (4, 5 were Q4_2/Q4_3).
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

type typeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
	supported bool
}

var types = map[Type]typeInfo{
	F32:     {"F32", 1, 4, true},
	F16:     {"F16", 1, 2, true},
	BF16:    {"BF16", 1, 2, true},
	Q4_0:    {"Q4_0", 32, 18, true},
	Q4_1:    {"Q4_1", 32, 20, true},
	Q5_0:    {"Q5_0", 32, 22, true},
	Q5_1:    {"Q5_1", 32, 24, true},
	Q8_0:    {"Q8_0", 32, 34, true},
	Q8_1:    {"Q8_1", 32, 36, true},
	Q2_K:    {"Q2_K", 256, 84, true},
	Q3_K:    {"Q3_K", 256, 110, true},
	Q4_K:    {"Q4_K", 256, 144, true},
	Q5_K:    {"Q5_K", 256, 176, true},
	Q6_K:    {"Q6_K", 256, 210, true},
	Q8_K:    {"Q8_K", 256, 292, true},
	IQ2_XXS: {"IQ2_XXS", 256, 66, false},
	IQ2_XS:  {"IQ2_XS", 256, 74, false},
	IQ3_XXS: {"IQ3_XXS", 256, 98, false},
	IQ1_S:   {"IQ1_S", 256, 50, false},
	IQ4_NL:  {"IQ4_NL", 32, 18, true},
	IQ3_S:   {"IQ3_S", 256, 110, false},
	IQ2_S:   {"IQ2_S", 256, 82, false},
	IQ4_XS:  {"IQ4_XS", 256, 136, true},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", 256, 56, false},
	TQ1_0:   {"TQ1_0", 256, 54, false},
	TQ2_0:   {"TQ2_0", 256, 66, false},
	MXFP4:   {"MXFP4", 32, 17, true},
}

// String returns the ggml name of the type, or "type(N)" for unknown ids.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known reports whether the id is a ggml type whose block layout is known
// (enough to compute sizes), supported or not.
// Pagoda's own types (GQ4, GQ8) are not: GGUF files never hold them.
func (t Type) Known() bool { _, ok := types[t]; return ok && !t.local() }

// local reports a Pagoda-only type id (above ggml's range).
func (t Type) local() bool { return t >= 0x10000 }

// Supported reports whether Pagoda can dequantize and compute with the type.
func (t Type) Supported() bool { return types[t].supported }

// BlockSize is the number of elements per block (1 for plain float types).
func (t Type) BlockSize() int { return types[t].blockSize }

// TypeSize is the number of bytes per block.
func (t Type) TypeSize() int { return types[t].typeSize }

// RowSize returns the bytes needed for n elements, or an error when n is not
// a whole number of blocks or the type is unknown.
func RowSize(t Type, n int) (int, error) {
	ti, ok := types[t]
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("%s: %d elements is not a multiple of the block size %d", ti.name, n, ti.blockSize)
	}
	return n / ti.blockSize * ti.typeSize, nil
}

// ParseType maps a ggml type name ("Q4_K", "f16", …) to its id.
func ParseType(name string) (Type, error) {
	for t, ti := range types {
		if !t.local() && equalFold(ti.name, name) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown tensor type %q", name)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
