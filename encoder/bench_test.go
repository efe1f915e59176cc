package encoder

import (
	"os"
	"path/filepath"
	"testing"

	"pagoda/quant"
	"pagoda/synth"
)

// BenchmarkEmbed: a MiniLM-L6-shaped encoder (6 layers, d 384, 12 heads,
// FFN 1536) in F16, 8 inputs of 128 tokens per pass. PAGODA_BENCH_BERT
// names a file to keep (or reuse) the synthetic model, for running
// llama.cpp's llama-embedding on the same weights.
func BenchmarkEmbed(b *testing.B) {
	p := os.Getenv("PAGODA_BENCH_BERT")
	if p == "" {
		p = filepath.Join(b.TempDir(), "minilm.gguf")
	}
	if _, err := os.Stat(p); err != nil {
		if err := synth.WriteBERT(p, synth.BERT{Layers: 6, Embd: 384, Heads: 12, FFN: 1536, Positions: 512, Pooling: 1, Type: quant.F16, Seed: 5}); err != nil {
			b.Fatal(err)
		}
	}
	m, err := Load(p, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	seqs := make([][]int32, 8)
	for i := range seqs {
		seqs[i] = make([]int32, 128)
		for j := range seqs[i] {
			seqs[i][j] = int32(5 + (i*131+j*7)%200)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Embed(seqs, -1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*8*128)/b.Elapsed().Seconds(), "tokens/s")
}
