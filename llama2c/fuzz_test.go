package llama2c

import (
	"encoding/binary"
	"testing"

	"pagoda/quant"
)

// FuzzParse: any accepted checkpoint has tensors whose byte size matches
// their type and dims, and a config that passes validation.
func FuzzParse(f *testing.F) {
	le := binary.LittleEndian
	var v0 []byte
	for _, x := range []int32{4, 6, 1, 2, 1, 3, 2} {
		v0 = le.AppendUint32(v0, uint32(x))
	}
	n := 3*4 + 4 + 4*4 + 2*4*2 + 4*4 + 4 + 3*4*6 + 4 + 2*2*1
	f.Add(append(v0, make([]byte, 4*n)...))
	cfg := Config{Dim: 4, HiddenDim: 8, NLayers: 1, NHeads: 2, NKVHeads: 2, VocabSize: 3, SeqLen: 2, Version: 2, SharedClassifier: true}
	v2 := v12Header(cfg, 4)
	f.Add(append(v2, make([]byte, 4096)...))
	cfg.Version = 1
	f.Add(append(v12Header(cfg, 0), make([]byte, 4096)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		if err := c.Config.validate(); err != nil {
			t.Fatalf("accepted config: %v", err)
		}
		for _, tt := range c.Tensors {
			elems := 1
			for _, d := range tt.Dims {
				elems *= int(d)
			}
			want, err := quant.RowSize(tt.Type, elems)
			if err != nil || len(tt.Data) != want {
				t.Fatalf("%s: %d bytes for %s %v", tt.Name, len(tt.Data), tt.Type, tt.Dims)
			}
		}
	})
}
