// Package cluster runs one model across worker processes: tensor
// parallelism over TCP (Group, Mesh), and pipeline parallelism, each
// worker a stage of contiguous layers handing its hidden states to the
// next (Pipeline, stage.go), and both together: stages that are each a
// tensor-parallel group with its own mesh (PipelineOptions.Tensor). A worker (`pagoda worker`) loads its rank's shard
// of the weights and owns its shard of the KV storage; the coordinator (the
// engine inside `pagoda serve` or `run`) keeps the scheduler, the KV
// manager and the sampler, and sends every step to all workers through the
// executor wire. The ranks exchange partial sums among themselves over a
// full mesh of TCP connections (Mesh), not through the coordinator.
package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"pagoda/executor"
)

// Mesh is one rank's view of a tensor-parallel group over TCP: a
// connection to every other rank. It is the model's Collective. Every rank
// sums the ranks' buffers in rank order, so all ranks hold the same bits
// after an all-reduce, as with the in-process group.
//
// A collective cannot fail in the model's interface (the forward pass has
// no error path between layers), so the first failure is kept: later
// operations do nothing, and the worker reports Err after the step.
type Mesh struct {
	rank, ranks int
	peers       []*peer // by rank; nil at this rank
	timeout     time.Duration
	seq         uint32 // operations so far: both ends must agree

	mu  sync.Mutex
	err error

	// wire is the form of the payloads (WireF32 unless SetWire); out is
	// this rank's payload, encoded once for every peer.
	wire codec
	out  []byte
	sent atomic.Int64  // payload and header bytes written to the peers
	also *atomic.Int64 // counts them too, when set (Worker.Sent)
	bufs [][]float32   // received, by rank
	sum  []float32

	// topK > 0: the next all-gathers (the output head's) exchange each
	// rank's top k per row instead of its whole slice (SetTopK).
	topK   int
	tkMsg  []float32
	tkIDs  []int32
	tkVals []float32
}

type peer struct {
	c  net.Conn
	r  *bufio.Reader
	w  *bufio.Writer
	in []byte
	c2 codec // decodes this peer's payloads
}

// opTimeout bounds one exchange: a rank that stops answering (killed,
// stopped, a dead link) fails the step instead of hanging the group. The
// coordinator may set another (GroupOptions.Exchange).
const opTimeout = 2 * time.Minute

// Timeouts bound how long a group waits on a worker that stops answering
// (stopped, hung, a link that drops packets): a step fails instead of
// hanging.
type Timeouts struct {
	// Exchange bounds each exchange between workers (a mesh message, a
	// hand-off between stages); 0: two minutes. It must exceed the
	// slowest step's compute on a stage, which a stage's successor waits
	// out.
	Exchange time.Duration
}

// timeoutsOf is the timeouts a hello asks for.
func timeoutsOf(h *hello) Timeouts {
	return Timeouts{Exchange: time.Duration(h.ExchangeMS) * time.Millisecond}
}

// exchange is the workers' deadline for one exchange.
func (t Timeouts) exchange() time.Duration {
	if t.Exchange > 0 {
		return t.Exchange
	}
	return opTimeout
}

// answer is how long the coordinator waits for a worker's output: longer
// than the workers' own deadline, so that when one worker stalls the
// others first fail their exchanges with it (naming it) and the stalled
// worker is the one whose answer times out.
func (t Timeouts) answer() time.Duration {
	e := t.exchange()
	return e + max(e/10, time.Second)
}

// stalled makes a read that timed out say what it means.
func stalled(err error, wait time.Duration) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("no answer within %v (the worker is stopped, hung or unreachable): %w", wait, err)
	}
	return err
}

// NewMesh is rank's mesh over conns, the connections to each other rank
// (conns[rank] is nil).
func NewMesh(rank int, conns []net.Conn) *Mesh {
	m := &Mesh{rank: rank, ranks: len(conns), peers: make([]*peer, len(conns)), timeout: opTimeout, bufs: make([][]float32, len(conns))}
	for r, c := range conns {
		if r != rank && c != nil {
			m.peers[r] = &peer{c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16)}
		}
	}
	return m
}

// SetWire sets the form the all-reduce payloads travel in (all-gathers,
// which carry logits, stay f32). Every rank of the group
// must use the same (the coordinator's hello says which); a message in
// another form fails the exchange.
func (m *Mesh) SetWire(d WireDType) {
	m.wire.d = d
}

// SetTopK makes the all-gathers that follow (the vocabulary-split output
// head's, the only one a forward pass makes) send, for each row, only
// this rank's k largest logits with their ids instead of its whole
// slice: the gathered rows then hold every rank's candidates at their
// ids and the lowest finite float elsewhere (the model refuses
// non-finite logits), which has the same top k as the whole row. 0 restores whole slices. Every rank must set the same.
func (m *Mesh) SetTopK(k int) { m.topK = k }

// Sent is the bytes this rank has written to the other ranks.
func (m *Mesh) Sent() int64 { return m.sent.Load() }

// Err is the first failure of an exchange, if any.
func (m *Mesh) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *Mesh) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
	// Closing makes the other ranks' reads fail at once instead of at
	// their timeout.
	m.Close()
}

// Close closes the connections to the other ranks.
func (m *Mesh) Close() {
	for _, p := range m.peers {
		if p != nil {
			p.c.Close()
		}
	}
}

// ringMin is the smallest all-reduce, in bytes on the wire, that goes
// around a ring when there are three ranks or more. The full mesh sends
// each rank's whole buffer to every other rank, (N−1)·m bytes in one
// exchange; the ring sends 2(N−1)/N·m in 2(N−1) steps. The ring's extra
// steps cost latency, so a decode step's small sums stay on the mesh and
// a prefill chunk's large ones go around (docs/parallel.md, "Cost").
const ringMin = 64 << 10

// AllReduce sums x over the ranks in place: over the full mesh, or around
// a ring for large buffers among three ranks or more. Either way every
// rank ends with the same bits.
func (m *Mesh) AllReduce(_ int, x []float32) {
	if m.ranks >= 3 && len(x)*m.wire.d.Size() >= ringMin && len(x) >= m.ranks {
		m.ringAllReduce(x)
		return
	}
	if !m.exchange('R', x, &m.wire) {
		return
	}
	// The others received this rank's values rounded to the wire form:
	// sum the same numbers here.
	m.wire.round(x)
	m.sum = grow(m.sum, len(x))
	clear(m.sum)
	for r := 0; r < m.ranks; r++ {
		b := x
		if r != m.rank {
			b = m.bufs[r]
		}
		for i, v := range b {
			m.sum[i] += v
		}
	}
	copy(x, m.sum)
}

// ringAllReduce is AllReduce as a reduce-scatter then an all-gather
// around the ring of ranks 0→1→…→N−1→0: x splits into N chunks; in each
// of N−1 steps every rank sends one chunk's partial sum to the next rank
// and adds the previous rank's into its own copy, so rank r ends holding
// the whole sum of chunk r+1; in N−1 more steps the finished chunks go
// around. A chunk's sum is added in one order (along the ring from its
// first sender), rounded to the wire form at every hop, and its owner
// rounds its finished sum as the others receive it, so every rank holds
// the same bits.
func (m *Mesh) ringAllReduce(x []float32) {
	n, r := m.ranks, m.rank
	next, prev := (r+1)%n, (r+n-1)%n
	chunk := func(c int) []float32 {
		c = ((c % n) + n) % n
		return x[c*len(x)/n : (c+1)*len(x)/n]
	}
	m.wire.round(x) // what the others receive of this rank's values
	for s := 0; s < n-1; s++ {
		got, ok := m.ringStep('S', next, prev, chunk(r-s), &m.wire)
		if !ok {
			return
		}
		dst := chunk(r - s - 1)
		if len(got) != len(dst) {
			m.fail(fmt.Errorf("tensor parallel: rank %d: ring chunk of %d values from rank %d, expected %d", r, len(got), prev, len(dst)))
			return
		}
		for i, v := range got {
			dst[i] += v
		}
		m.wire.round(dst)
	}
	for s := 0; s < n-1; s++ {
		got, ok := m.ringStep('A', next, prev, chunk(r+1-s), &m.wire)
		if !ok {
			return
		}
		dst := chunk(r - s)
		if len(got) != len(dst) {
			m.fail(fmt.Errorf("tensor parallel: rank %d: ring chunk of %d values from rank %d, expected %d", r, len(got), prev, len(dst)))
			return
		}
		copy(dst, got)
	}
}

// message encodes the next operation's message of x into m.out: a
// header (operation, sequence number, wire form, length) and the values.
// It returns the sequence number the peers' messages must carry too.
func (m *Mesh) message(op byte, x []float32, enc *codec) uint32 {
	m.seq++
	m.out = append(m.out[:0], op)
	m.out = binary.LittleEndian.AppendUint32(m.out, m.seq)
	m.out = append(m.out, byte(enc.d))
	m.out = binary.LittleEndian.AppendUint32(m.out, uint32(len(x)))
	m.out = enc.appendFloats(m.out, x)
	return m.seq
}

// ringStep sends part to rank next and receives rank prev's message of
// the same step, at once (each may exceed the sockets' buffers).
func (m *Mesh) ringStep(op byte, next, prev int, part []float32, enc *codec) ([]float32, bool) {
	if m.Err() != nil {
		return nil, false
	}
	seq := m.message(op, part, enc)
	deadline := time.Now().Add(m.timeout)
	pn, pp := m.peers[next], m.peers[prev]
	pn.c.SetDeadline(deadline)
	pp.c.SetDeadline(deadline)
	sent := make(chan error, 1)
	go func() { sent <- pn.send(m.out) }()
	var err error
	if m.bufs[prev], err = pp.recv(op, seq, enc.d, m.bufs[prev]); err != nil {
		m.fail(fmt.Errorf("tensor parallel: rank %d: ring step with rank %d: %w", m.rank, prev, err))
		<-sent
		return nil, false
	}
	if err := <-sent; err != nil {
		m.fail(fmt.Errorf("tensor parallel: rank %d: send to rank %d: %w", m.rank, next, err))
		return nil, false
	}
	m.sent.Add(int64(len(m.out)))
	if m.also != nil {
		m.also.Add(int64(len(m.out)))
	}
	return m.bufs[prev], true
}

// AllGather concatenates the ranks' columns of part, row by row, into
// full, in rank order.
func (m *Mesh) AllGather(_ int, part, full []float32, rows int) {
	if m.topK > 0 && rows > 0 {
		m.gatherTop(part, full, rows)
		return
	}
	// The only all-gather is the output head's: logits, which feed no
	// later layer, so rounding them costs accuracy and buys nothing the
	// wire form is for. They travel in f32 whatever the wire form (TopK
	// is what cuts their bytes). Measured on stories260K at TP=2 with
	// f16: rounding the logits too made 1 of 64 teacher-forced argmaxes
	// and the free-running greedy sequence differ from one process and
	// raised the mean KL tenfold (1.5e-6 against 1.4e-7).
	if !m.exchange('G', part, &codec{d: WireF32}) || rows == 0 {
		return
	}
	width := 0
	for r := 0; r < m.ranks; r++ {
		width += m.part(r, part) / rows
	}
	off := 0
	for r := 0; r < m.ranks; r++ {
		b := part
		if r != m.rank {
			b = m.bufs[r]
		}
		w := len(b) / rows
		for i := 0; i < rows; i++ {
			copy(full[i*width+off:i*width+off+w], b[i*w:(i+1)*w])
		}
		off += w
	}
}

// gatherTop is AllGather under SetTopK. A message is f32 bits whatever
// the wire form (ids do not survive rounding): the rank's slice width,
// then per row k (id, logit) pairs, the ids local to its slice.
func (m *Mesh) gatherTop(part, full []float32, rows int) {
	w := len(part) / rows
	k := min(m.topK, w)
	m.tkIDs, m.tkVals = growInts32(m.tkIDs, k), grow(m.tkVals, k)
	m.tkMsg = append(m.tkMsg[:0], math.Float32frombits(uint32(w)))
	for r := range rows {
		executor.TopKRow(part[r*w:(r+1)*w], 0, m.tkIDs, m.tkVals)
		for j := range k {
			m.tkMsg = append(m.tkMsg, math.Float32frombits(uint32(m.tkIDs[j])), m.tkVals[j])
		}
	}
	if !m.exchange('K', m.tkMsg, &codec{d: WireF32}) {
		return
	}
	width := len(full) / rows
	for i := range full {
		full[i] = -math.MaxFloat32
	}
	off := 0
	for q := 0; q < m.ranks; q++ {
		msg := m.tkMsg
		if q != m.rank {
			msg = m.bufs[q]
		}
		if len(msg) == 0 {
			m.fail(fmt.Errorf("tensor parallel: rank %d: an empty top-k message from rank %d", m.rank, q))
			return
		}
		qw := int(math.Float32bits(msg[0]))
		qk := (len(msg) - 1) / (2 * rows)
		if qw <= 0 || off+qw > width || len(msg) != 1+2*rows*qk || qk > qw {
			m.fail(fmt.Errorf("tensor parallel: rank %d: rank %d's top-k message (%d values, width %d) does not fit %d rows of %d", m.rank, q, len(msg), qw, rows, width))
			return
		}
		for r := range rows {
			pairs := msg[1+2*r*qk : 1+2*(r+1)*qk]
			for j := 0; j < len(pairs); j += 2 {
				id := int(math.Float32bits(pairs[j]))
				if id >= qw {
					m.fail(fmt.Errorf("tensor parallel: rank %d: rank %d's top-k id %d past its width %d", m.rank, q, id, qw))
					return
				}
				full[r*width+off+id] = pairs[j+1]
			}
		}
		off += qw
	}
}

func growInts32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

func (m *Mesh) part(r int, own []float32) int {
	if r == m.rank {
		return len(own)
	}
	return len(m.bufs[r])
}

// exchange sends x, in the form enc says, to every other rank and
// receives theirs into m.bufs. Each message is a header (operation,
// sequence number, wire form, length) and the values; a header that
// disagrees means the ranks ran different programs or were told
// different wire forms, which fails the group rather than mixing wrong
// numbers.
func (m *Mesh) exchange(op byte, x []float32, enc *codec) bool {
	if m.Err() != nil {
		return false
	}
	seq := m.message(op, x, enc)
	var wg sync.WaitGroup
	errs := make([]error, m.ranks)
	deadline := time.Now().Add(m.timeout)
	for r, p := range m.peers {
		if p == nil {
			continue
		}
		p.c.SetDeadline(deadline)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = p.send(m.out)
			if errs[r] == nil {
				m.sent.Add(int64(len(m.out)))
				if m.also != nil {
					m.also.Add(int64(len(m.out)))
				}
			}
		}()
	}
	for r, p := range m.peers {
		if p == nil {
			continue
		}
		var err error
		if m.bufs[r], err = p.recv(op, seq, enc.d, m.bufs[r]); err != nil {
			m.fail(fmt.Errorf("tensor parallel: rank %d: exchange with rank %d: %w", m.rank, r, err))
			wg.Wait()
			return false
		}
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			m.fail(fmt.Errorf("tensor parallel: rank %d: send to rank %d: %w", m.rank, r, err))
			return false
		}
	}
	return true
}

func (p *peer) send(msg []byte) error {
	if _, err := p.w.Write(msg); err != nil {
		return err
	}
	return p.w.Flush()
}

// maxFloats bounds what a peer can make this rank allocate (1 GiB).
const maxFloats = 1 << 28

func (p *peer) recv(op byte, seq uint32, d WireDType, dst []float32) ([]float32, error) {
	var h [10]byte
	if _, err := io.ReadFull(p.r, h[:]); err != nil {
		return dst, err
	}
	gotSeq, n := binary.LittleEndian.Uint32(h[1:]), binary.LittleEndian.Uint32(h[6:])
	if h[0] != op || gotSeq != seq {
		return dst, fmt.Errorf("out of step: got operation %q #%d, expected %q #%d", h[0], gotSeq, op, seq)
	}
	if got := WireDType(h[5]); got != d {
		return dst, fmt.Errorf("the peer sends %s on the wire, this rank expects %s", got, d)
	}
	if n > maxFloats {
		return dst, fmt.Errorf("message of %d floats", n)
	}
	p.in = growBytes(p.in, d.Size()*int(n))
	if _, err := io.ReadFull(p.r, p.in); err != nil {
		return dst, err
	}
	dst = grow(dst, int(n))
	p.c2.d = d
	p.c2.decode(dst, p.in)
	return dst, nil
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func growBytes(s []byte, n int) []byte {
	if cap(s) < n {
		return make([]byte, n)
	}
	return s[:n]
}
