package speed

import (
	"testing"
	"time"

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

// TestInt8Share: a pp result counts every weight element a token goes
// through once (the parameters less the norm weights and, where the
// output head is a matrix of its own, the embedding table, of which a
// token reads one row), and its share of a measured int8 peak is that
// work at its rate.
func TestInt8Share(t *testing.T) {
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Run(m, Test{Kind: "pp", N: 32}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &m.Config
	norms := int64(c.NEmbd) * int64(2*c.NLayer+1)
	embd := int64(c.VocabSize) * int64(c.NEmbd)
	if c.TiedOutput {
		embd = 0
	}
	if want := float64(c.Params() - norms - embd); r.MACsPerToken != want {
		t.Errorf("%v multiply-adds a token, want %v (parameters %d less norms %d and embedding %d)", r.MACsPerToken, want, c.Params(), norms, embd)
	}
	if r.PeakShare() != 0 {
		t.Errorf("share %v without a peak", r.PeakShare())
	}
	pk, err := MeasureInt8Peak(m.Pool(), m.Ops(), 20*time.Millisecond, 2)
	if err != nil {
		t.Skip(err)
	}
	if pk.MACps <= 0 || pk.Median > pk.MACps || pk.Threads != 2 {
		t.Fatalf("peak %+v", pk)
	}
	r.Int8Peak = pk.MACps
	if got, want := r.PeakShare(), r.Mean*r.MACsPerToken/pk.MACps; got != want || got <= 0 {
		t.Errorf("share %v, want %v", got, want)
	}
}
