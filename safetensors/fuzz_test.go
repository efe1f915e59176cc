package safetensors

import (
	"bytes"
	"testing"
)

// FuzzParse checks that any accepted file yields in-bounds tensors whose
// size matches dtype and shape, and that re-marshalling it round-trips.
func FuzzParse(f *testing.F) {
	b, err := Marshal([]*Tensor{
		{Name: "a", DType: "F32", Shape: []int64{2}, Data: make([]byte, 8)},
		{Name: "b", DType: "F4", Shape: []int64{2, 1}, Data: []byte{0x21}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(withHeader(`{"a": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]}}`, 2))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse(b)
		if err != nil {
			return
		}
		for _, tt := range g.Tensors {
			bits, ok := DTypeBits(tt.DType)
			if !ok || int64(len(tt.Data))*8 != tt.Elements()*int64(bits) {
				t.Fatalf("tensor %q: %d bytes for %s %v", tt.Name, len(tt.Data), tt.DType, tt.Shape)
			}
		}
		m, err := Marshal(g.Tensors, g.Metadata)
		if err != nil {
			t.Fatalf("re-marshal: %v", err)
		}
		h, err := Parse(m)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		for _, tt := range g.Tensors {
			u, ok := h.Tensor(tt.Name)
			if !ok || !bytes.Equal(u.Data, tt.Data) || u.DType != tt.DType {
				t.Fatalf("tensor %q lost in the round trip", tt.Name)
			}
		}
	})
}
