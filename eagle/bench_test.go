package eagle

import (
	"context"
	"fmt"
	"testing"

	"pagoda/model"
	"pagoda/spec"
)

// BenchmarkPropose is one EAGLE-2 proposal (catch-up of one row, tree of
// depth 5, top-4, 32 nodes kept) for the repository's KJV model with a
// draft of its shape, next to the target's own one-token decode.
func BenchmarkPropose(b *testing.B) {
	m, err := model.Open("../models/kjv3m.q8_0.gguf", model.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	d, err := newDraft(ShapeOf(&m.Config, 0), m, "")
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	d.init(1)
	data, err := Sample(context.Background(), m, 1, 100, 1, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	seq, f := data.Seqs[0], data.Feats[0]
	dd := d.Shape.D
	for _, k := range []int{4, 8} {
		b.Run(fmt.Sprintf("topk%d", k), func(b *testing.B) {
			p := d.Proposer(ProposerOptions{TopK: k, Depth: 5})
			r := &spec.Req{ID: 1, Tokens: seq[:90], Max: 32, Features: f[:89*dd]}
			if err := p.Propose([]*spec.Req{r}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.Truncate(1, 89)
				r := &spec.Req{ID: 1, Tokens: seq[:90], Max: 32, Features: f[88*dd : 89*dd], FeatFrom: 88}
				if err := p.Propose([]*spec.Req{r}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("target-decode", func(b *testing.B) {
		c := &m.Config
		kv := model.NewFlatCache(c, 1, 128)
		for i := 0; i < b.N; i++ {
			if i%100 == 0 {
				kv = model.NewFlatCache(c, 1, 128)
			}
			if _, err := m.Forward(&model.Batch{Tokens: seq[i%100 : i%100+1], Pos: []int32{int32(i % 100)}, Seq: []int32{0}}, kv); err != nil {
				b.Fatal(err)
			}
		}
	})
}
