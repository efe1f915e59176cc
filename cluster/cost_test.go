package cluster

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/synth"
	"pagoda/testutil"
)

// The cost measurements of docs/parallel.md ("Cost: collectives, bytes
// per token, and 70B across machines"): the time of one all-reduce and
// of one stage hand-off against the message size over real loopback TCP
// (BenchmarkAllReduce, BenchmarkHandOff; scripts/allreduce-bench.sh fits
// t = α + β·bytes to them), and the bytes a step moves against the
// formula derived from mesh.go and stage.go (TestBytesPerStep).

// loopbackConns connects n ranks pairwise over 127.0.0.1: conns[i][j] is
// rank i's connection to rank j.
func loopbackConns(tb testing.TB, n int) [][]net.Conn {
	tb.Helper()
	conns := make([][]net.Conn, n)
	for i := range conns {
		conns[i] = make([]net.Conn, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				tb.Fatal(err)
			}
			acc := make(chan net.Conn, 1)
			go func() {
				c, _ := ln.Accept()
				acc <- c
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				tb.Fatal(err)
			}
			conns[i][j], conns[j][i] = c, <-acc
			ln.Close()
			if conns[j][i] == nil {
				tb.Fatal("accept failed")
			}
		}
	}
	return conns
}

// costSizes are the message sizes of the benchmarks: 256 B to 16 MiB, ×4.
var costSizes = []int{256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20}

func sizeName(b int) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// BenchmarkAllReduce: one all-reduce of a message of the named size (the
// f32 activations' bytes; f16 puts half of them on the wire) among 2 and
// 4 ranks in this process, each a Mesh over its own loopback TCP
// connections, as a tensor-parallel worker's. ns/op is one all-reduce
// as rank 0 sees it (all ranks run in lockstep); algGB/s is the message
// bytes over that time, sentGB/s what one rank writes to its peers
// ((N−1) copies of the payload and its 10-byte header) over it.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, d := range []WireDType{WireF32, WireF16} {
			for _, size := range costSizes {
				b.Run(fmt.Sprintf("ranks=%d/wire=%s/size=%s", n, d, sizeName(size)), func(b *testing.B) {
					benchAllReduce(b, n, d, size)
				})
			}
		}
	}
}

func benchAllReduce(b *testing.B, n int, d WireDType, size int) {
	conns := loopbackConns(b, n)
	ms := make([]*Mesh, n)
	bufs := make([][]float32, n)
	for r := range ms {
		ms[r] = NewMesh(r, conns[r])
		ms[r].SetWire(d)
		ms[r].timeout = time.Minute
		bufs[r] = make([]float32, size/4)
		defer ms[r].Close()
	}
	// One warm-up exchange sizes every buffer.
	var wg sync.WaitGroup
	for r, m := range ms {
		wg.Go(func() { m.AllReduce(r, bufs[r]) })
	}
	wg.Wait()
	sent0 := ms[0].Sent()
	b.ResetTimer()
	for r := 1; r < n; r++ {
		wg.Go(func() {
			for range b.N {
				ms[r].AllReduce(r, bufs[r])
			}
		})
	}
	for range b.N {
		ms[0].AllReduce(0, bufs[0])
	}
	b.StopTimer()
	wg.Wait()
	for r, m := range ms {
		if err := m.Err(); err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)/sec/1e9, "algGB/s")
	b.ReportMetric(float64(ms[0].Sent()-sent0)/float64(b.N)/sec/1e9, "sentGB/s")
}

// BenchmarkHandOff: a pipeline stage's hand-off of hidden states of the
// named size (f32 bytes) over loopback TCP, encoded, framed and decoded
// as stage.go does. The stages bounce the message back and forth, so
// one op is two hand-offs; oneway-µs is half of it, GB/s the message
// bytes over that half. wire=raw is the baseline: the same bytes written
// and read with no encoding, framing or decoding (what TCP over loopback
// costs in Go on this machine).
func BenchmarkHandOff(b *testing.B) {
	for _, d := range []string{"f32", "f16", "raw"} {
		for _, size := range costSizes {
			b.Run(fmt.Sprintf("wire=%s/size=%s", d, sizeName(size)), func(b *testing.B) {
				benchHandOff(b, d, size)
			})
		}
	}
}

// handEnd is one end of a hand-off link.
type handEnd struct {
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	wire codec
	raw  bool // bytes as they are: no encoding, framing or decoding
	rbuf []byte
	wbuf []byte
	in   executor.StepOutput
}

func (e *handEnd) send(x []float32) error {
	if e.raw {
		e.wbuf = growBytes(e.wbuf, 4*len(x))
		if _, err := e.w.Write(e.wbuf); err != nil {
			return err
		}
		return e.w.Flush()
	}
	e.wbuf = e.wire.appendHidden(e.wbuf[:0], x)
	return executor.WriteFrame(e.w, e.wbuf)
}

func (e *handEnd) recv() ([]float32, error) {
	if e.raw {
		e.rbuf = growBytes(e.rbuf, 4*len(e.in.Logits))
		_, err := io.ReadFull(e.r, e.rbuf)
		return e.in.Logits, err
	}
	var err error
	if e.rbuf, err = executor.ReadFrame(e.r, e.rbuf); err != nil {
		return nil, err
	}
	if err := e.wire.decodeHidden(e.rbuf, &e.in); err != nil {
		return nil, err
	}
	return e.in.Logits, nil
}

func benchHandOff(b *testing.B, form string, size int) {
	d, err := ParseWireDType(form)
	raw := form == "raw"
	if err != nil && !raw {
		b.Fatal(err)
	}
	conns := loopbackConns(b, 2)
	ends := make([]*handEnd, 2)
	for i := range ends {
		c := conns[i][1-i]
		defer c.Close()
		ends[i] = &handEnd{c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16), wire: codec{d: d}, raw: raw}
	}
	x := make([]float32, size/4)
	if raw {
		// The raw ends know the size from here.
		for _, e := range ends {
			e.in.Logits = x
		}
	}
	errc := make(chan error, 1)
	echo := func(k int) {
		for range k {
			y, err := ends[1].recv()
			if err == nil {
				err = ends[1].send(y)
			}
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}
	bounce := func() {
		if err := ends[0].send(x); err != nil {
			b.Fatal(err)
		}
		y, err := ends[0].recv()
		if err != nil || len(y) != len(x) {
			b.Fatalf("got %d values back (%v), sent %d", len(y), err, len(x))
		}
	}
	go echo(1)
	bounce()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	go echo(b.N)
	for range b.N {
		bounce()
	}
	b.StopTimer()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	half := b.Elapsed().Seconds() / float64(b.N) / 2
	b.ReportMetric(half*1e6, "oneway-µs")
	b.ReportMetric(float64(size)/half/1e9, "GB/s")
}

// costCase is one split whose bytes TestBytesPerStep measures.
type costCase struct {
	tp, pp int
	wire   WireDType
}

func (c costCase) String() string {
	s := ""
	if c.tp > 1 {
		s = fmt.Sprintf("tp%d", c.tp)
	}
	if c.pp > 1 {
		if s != "" {
			s += "×"
		}
		s += fmt.Sprintf("pp%d", c.pp)
	}
	return s + " " + c.wire.String()
}

// stepBytes is what every worker of the split writes to other workers
// in one step of T rows whose last row's logits are asked for, derived
// from mesh.go and stage.go (whole steps, no top-k):
//
//   - each all-reduce sends the rank's whole buffer to each of the N−1
//     other ranks (a full mesh, not a ring): a 10-byte header and T·d
//     values in the wire form (s bytes each), from every rank;
//   - a stage's ranks all-reduce twice per layer (after o_proj and after
//     down_proj, the row-parallel projections), stage 0 once more after
//     the vocabulary-split embedding lookup;
//   - the last stage's vocabulary-split output head all-gathers each
//     rank's V/N logits of the one row in f32 (10-byte header);
//   - each stage boundary is crossed by N copies (rank r to rank r) of
//     the T·d hidden states, framed: 4-byte frame length plus a 5-byte
//     f32 output header, or a 6-byte header in f16/bf16.
func stepBytes(c costCase, layers, d, vocab, T int) int64 {
	s := int64(c.wire.Size())
	n := int64(c.tp)
	reduce := 10 + int64(T*d)*s
	var total int64
	stages, _ := StageLayers(layers, c.pp)
	if c.pp == 1 {
		stages = []model.Stage{{Lo: 0, Hi: layers}}
	}
	for i, st := range stages {
		if n == 1 {
			break
		}
		k := int64(2 * (st.Hi - st.Lo))
		if i == 0 {
			k++
		}
		per := k * reduce
		if i == len(stages)-1 {
			per += 10 + 4*int64(vocab)/n
		}
		total += n * (n - 1) * per
	}
	hdr := int64(4 + 5)
	if c.wire != WireF32 {
		hdr = 4 + 6
	}
	total += int64(c.pp-1) * n * (int64(T*d)*s + hdr)
	return total
}

// TestBytesPerStep: the bytes the workers send in a prefill and in each
// decode step equal stepBytes, for tensor, pipeline and both, in f32 and
// f16, on stories260K.
func TestBytesPerStep(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "models/gguf"), "stories260K.gguf")
	bytesPerStep(t, path, []int32{1, 403, 407, 261, 378, 300, 2}, 8, []costCase{
		{2, 1, WireF32}, {2, 1, WireF16}, {4, 1, WireF32}, {4, 1, WireF16},
		{1, 2, WireF32}, {1, 2, WireF16}, {1, 5, WireF32}, {2, 2, WireF32}, {2, 2, WireF16},
	})
}

// TestBytesPerStepTinyLlama: the same on a TinyLlama-shaped synthetic
// file (width 2048, 32 heads over 4 KV heads, vocabulary 32000) cut to 2
// layers, a 240 MB file written to a temporary directory: set
// PAGODA_TIMING=1.
func TestBytesPerStepTinyLlama(t *testing.T) {
	if os.Getenv("PAGODA_TIMING") == "" {
		t.Skip("a measurement (set PAGODA_TIMING=1): a 2-layer TinyLlama-shaped model at Q8_0")
	}
	sh, err := synth.Preset("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	sh.Layers = 2
	path := filepath.Join(t.TempDir(), "tl2.gguf")
	if err := synth.Write(path, synth.Options{Shape: sh, Type: quant.Q8_0, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	bytesPerStep(t, path, []int32{1, 450, 4996, 17354, 1701, 29916}, 3, []costCase{
		{2, 1, WireF32}, {2, 1, WireF16}, {4, 1, WireF32}, {1, 2, WireF32}, {1, 2, WireF16}, {2, 2, WireF32},
	})
}

func bytesPerStep(t *testing.T, path string, prompt []int32, n int, cases []costCase) {
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := coord.Config
	coord.Close()
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, NumBlocks: (len(prompt)+n)/16 + 2, DType: kvcache.F32}
	t.Logf("%s: %d layers, width %d, vocabulary %d; load average %s", filepath.Base(path), c.NLayer, c.NEmbd, c.VocabSize, loadAvg())
	for _, cc := range cases {
		addrs, ws := startWorkersW(t, path, cc.tp*cc.pp, "")
		var ex interface {
			executor.Executor
			Close() error
		}
		if cc.pp == 1 {
			shard, err := OpenShape(path, cc.tp, model.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			ex, err = Connect(addrs, GroupOptions{Model: &shard.Config, KV: kc, Threads: 1, Timeout: time.Minute, Wire: cc.wire})
			shard.Close()
		} else {
			shard, err := OpenGridShape(path, cc.tp, model.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			ex, err = ConnectPipeline(addrs, PipelineOptions{Model: &shard.Config, KV: kc, Threads: 1, MicroBatches: 1, Timeout: time.Minute, Tensor: cc.tp, Wire: cc.wire})
			shard.Close()
		}
		if err != nil {
			t.Fatalf("%s: %v", cc, err)
		}
		r := drive(t, ex, kc, prompt, n, nil, func() (b int64) {
			for _, w := range ws {
				b += w.Sent()
			}
			return b
		})
		ex.Close()
		pre, dec := stepBytes(cc, c.NLayer, c.NEmbd, c.VocabSize, len(prompt)), stepBytes(cc, c.NLayer, c.NEmbd, c.VocabSize, 1)
		perLayer := 0.0
		if cc.tp > 1 {
			// One rank's share of one layer's two all-reduces.
			perLayer = float64(2 * (cc.tp - 1) * (10 + c.NEmbd*cc.wire.Size()))
		}
		t.Logf("%-10s prefill of %d tokens: %d bytes (formula %d); decode: %.1f bytes/step (formula %d); one rank, one layer, one decode token: %.0f",
			cc, len(prompt), r.prefillBytes, pre, float64(r.decodeBytes)/float64(n-1), dec, perLayer)
		if r.prefillBytes != pre || r.decodeBytes != dec*int64(n-1) {
			t.Errorf("%s: workers sent %d bytes in the prefill and %d in %d decode steps, the formula says %d and %d",
				cc, r.prefillBytes, r.decodeBytes, n-1, pre, dec*int64(n-1))
		}
	}
}
