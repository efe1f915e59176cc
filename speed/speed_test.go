package speed

import (
	"testing"

	"pagoda/embedded"
	"pagoda/kernels"
	"pagoda/model"
)

func TestReadBandwidth(t *testing.T) {
	p := kernels.NewPool(2)
	defer p.Close()
	b, err := ReadBandwidth(p, kernels.Best(), 8<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bytes != 8<<20 || b.GBps <= 0 || b.Median <= 0 || b.Median > b.GBps {
		t.Fatalf("bandwidth %+v", b)
	}
	if _, err := ReadBandwidth(p, kernels.Best(), 100, 1); err == nil {
		t.Fatal("a buffer smaller than one chunk was accepted")
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatal(m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatal(m)
	}
}

func TestBatchedDecode(t *testing.T) {
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	one, err := Run(m, Test{Kind: "tg", N: 16}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	four, err := Run(m, Test{Kind: "tg", N: 16, Seqs: 4}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if one.Test != "tg16" || four.Test != "tg16x4" || one.Tokens != 16 || four.Tokens != 64 || four.Seqs != 4 {
		t.Fatalf("results %+v %+v", one, four)
	}
	if four.PerSeq*4 != four.Mean || four.GBps <= 0 {
		t.Fatalf("batched result %+v", four)
	}
}
