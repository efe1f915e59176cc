package train

import (
	"os"
	"strconv"
	"testing"
)

// BenchmarkStep is one forward+backward of the KJV model's shape at batch
// 2 × 512; tokens/s = 1024 / (ns/op · 1e-9).
func BenchmarkStep(b *testing.B) {
	c := Config{Dim: 256, Layers: 4, Heads: 8, KVHeads: 4, HeadDim: 32, FFN: 688, Vocab: 2048, Context: 512,
		RopeTheta: 10000, RMSEps: 1e-5, Tied: true}
	m, err := NewModel(c, benchThreads())
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c.Init(m.Params, 1)
	B, T := 2, 512
	tokens, targets := tinyBatch(c, B, T, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Forward(tokens, targets, B, T); err != nil {
			b.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(B*T*b.N)/b.Elapsed().Seconds(), "tok/s")
}

func benchThreads() int {
	n, _ := strconv.Atoi(os.Getenv("TRAIN_THREADS"))
	return n
}
