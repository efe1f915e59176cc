package speed

import (
	"errors"
	"math"
	"sort"
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
	m := openEmbedded(t)
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
	m := openEmbedded(t)
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

// TestPairedShares: with a probe after every repetition, each repetition
// is divided by its own probe and the share is the median of those
// ratios, for decode against the read bandwidth and for prefill against
// the int8 peak.
func TestPairedShares(t *testing.T) {
	m := openEmbedded(t)
	calls := 0
	probe := func() (float64, float64, error) {
		calls++
		return float64(calls), 1e9 * float64(calls), nil
	}
	r, err := RunPaired(m, Test{Kind: "tg", N: 8}, 3, 0, nil, probe)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 || len(r.PairedReadGBps) != 3 || r.PairedReadGBps[2] != 3 {
		t.Fatalf("%d probes, paired %v", calls, r.PairedReadGBps)
	}
	var bw, pk []float64
	for i, s := range r.Samples {
		bw = append(bw, s*r.BytesPerToken/1e9/float64(i+1))
		pk = append(pk, s*r.MACsPerToken/(1e9*float64(i+1)))
	}
	sort.Float64s(bw)
	sort.Float64s(pk)
	if got := r.BWShare(); math.Abs(got-bw[1]) > 1e-12*bw[1] {
		t.Errorf("bandwidth share %v, want the median ratio %v of %v", got, bw[1], bw)
	}
	if got := r.PeakShare(); math.Abs(got-pk[1]) > 1e-12*pk[1] {
		t.Errorf("peak share %v, want the median ratio %v of %v", got, pk[1], pk)
	}
	// Without pairs the run's probe is the divisor.
	r.PairedReadGBps, r.ReadGBps = nil, 2
	if got, want := r.BWShare(), r.GBps/2; got != want {
		t.Errorf("unpaired share %v, want %v", got, want)
	}
	if _, err := RunPaired(m, Test{Kind: "pp", N: 8}, 2, 0, nil, func() (float64, float64, error) { return 0, 0, errors.New("probe broke") }); err == nil {
		t.Error("a failing probe went unreported")
	}
}

// openEmbedded opens the embedded default model on 2 threads, closed
// when the test ends.
func openEmbedded(t *testing.T) *model.Model {
	t.Helper()
	path, err := embedded.Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
