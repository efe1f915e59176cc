package ring

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"
)

// Link is a Transport over TCP: one connection to the next rank (dialled)
// and one from the previous rank (accepted), each used in one direction.
//
// Wire format, little-endian. A connection opens with a hello from the
// dialler: "RING", u64 session, u32 rank, u32 ranks; the acceptor checks
// that it comes from its previous rank of the same session and ring size.
// Then each message is a header, u8 kind, u32 sequence number (messages
// so far in that direction: both ends must agree), and a body:
//
//	'B' blocks:  u32 count, then per block: i64 start, u32 rows, u32 kvd,
//	             rows·kvd f32 keys, rows·kvd f32 values
//	'P' partial: u32 rows, heads, kv heads, head dim, window, f32 scale,
//	             rows·heads f32 m, rows·heads f32 l, rows·heads·head dim f32 acc
//
// Every read and write has a deadline (Timeout from its start), so a rank
// that dies, stops or loses its link turns into an error at its
// neighbours rather than a hang; the first error closes both connections,
// which fails the neighbours' next operation at once.
type Link struct {
	rank, ranks int
	Timeout     time.Duration
	next, prev  *conn // nil on a ring of one

	mu  sync.Mutex
	err error
}

type conn struct {
	c   net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	seq uint32
	buf []byte
}

const (
	magic = "RING"
	// DefaultTimeout bounds one message (and joining the ring). A rank
	// waits for its previous rank's block while that rank computes a pass,
	// so the bound must exceed the slowest rank's pass (about (T/P)² ·
	// heads · head dim multiply-adds, twice); as the tensor-parallel
	// mesh's, it is two minutes.
	DefaultTimeout = 2 * time.Minute
	// maxFloats bounds what a peer's header can make this rank allocate (1 GiB).
	maxFloats = 1 << 28
)

// Join makes rank's link in a ring of len(addrs) ranks: it dials the next
// rank at its address and accepts the previous rank's connection on ln
// (this rank's listener, at addrs[rank]). Connections to ln with another
// session or from another rank are closed and waited past, so a stale
// connection from an earlier ring is never joined. Join gives up after
// timeout.
func Join(rank int, ln net.Listener, addrs []string, session uint64, timeout time.Duration) (*Link, error) {
	P := len(addrs)
	if rank < 0 || rank >= P {
		return nil, fmt.Errorf("ring: rank %d of %d", rank, P)
	}
	l := &Link{rank: rank, ranks: P, Timeout: timeout}
	if P == 1 {
		return l, nil
	}
	deadline := time.Now().Add(timeout)
	type res struct {
		c   net.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := accept(ln, session, (rank+P-1)%P, P, deadline)
		acc <- res{c, err}
	}()
	out, err := dial(addrs[(rank+1)%P], session, rank, P, deadline)
	if err != nil {
		// Unblock the accept: it would otherwise wait out the deadline.
		if d, ok := ln.(interface{ SetDeadline(time.Time) error }); ok {
			d.SetDeadline(time.Now())
		}
		if a := <-acc; a.c != nil {
			a.c.Close()
		}
		return nil, fmt.Errorf("ring: rank %d: %w", rank, err)
	}
	a := <-acc
	if a.err != nil {
		out.Close()
		return nil, fmt.Errorf("ring: rank %d: %w", rank, a.err)
	}
	l.next, l.prev = newConn(out), newConn(a.c)
	return l, nil
}

func newConn(c net.Conn) *conn {
	return &conn{c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16)}
}

func dial(addr string, session uint64, rank, ranks int, deadline time.Time) (net.Conn, error) {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err == nil {
			h := binary.LittleEndian.AppendUint64([]byte(magic), session)
			h = binary.LittleEndian.AppendUint32(h, uint32(rank))
			h = binary.LittleEndian.AppendUint32(h, uint32(ranks))
			c.SetDeadline(deadline)
			if _, err = c.Write(h); err == nil {
				c.SetDeadline(time.Time{})
				return c, nil
			}
			c.Close()
		}
		// The next rank may not listen yet: retry until the deadline.
		if time.Now().Add(50 * time.Millisecond).After(deadline) {
			return nil, fmt.Errorf("dial next rank at %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func accept(ln net.Listener, session uint64, from, ranks int, deadline time.Time) (net.Conn, error) {
	if d, ok := ln.(interface{ SetDeadline(time.Time) error }); ok {
		d.SetDeadline(deadline)
		defer d.SetDeadline(time.Time{})
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil, fmt.Errorf("accept previous rank %d: %w", from, err)
		}
		var h [20]byte
		c.SetDeadline(deadline)
		if _, err := io.ReadFull(c, h[:]); err == nil && string(h[:4]) == magic &&
			binary.LittleEndian.Uint64(h[4:]) == session &&
			int(binary.LittleEndian.Uint32(h[12:])) == from && int(binary.LittleEndian.Uint32(h[16:])) == ranks {
			c.SetDeadline(time.Time{})
			return c, nil
		}
		c.Close()
	}
}

// Rank implements Transport.
func (l *Link) Rank() int { return l.rank }

// Ranks implements Transport.
func (l *Link) Ranks() int { return l.ranks }

// Err is the error that broke the link, if any.
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close closes both connections; later operations fail.
func (l *Link) Close() error {
	l.fail(errors.New("link closed"))
	return nil
}

func (l *Link) fail(err error) error {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	err = l.err
	l.mu.Unlock()
	for _, c := range []*conn{l.next, l.prev} {
		if c != nil {
			c.c.Close()
		}
	}
	return err
}

// send writes one message (kind, sequence number, body) to the next rank.
func (l *Link) send(kind byte, body func(b []byte) []byte) error {
	if err := l.Err(); err != nil {
		return err
	}
	c := l.next
	if c == nil {
		return fmt.Errorf("ring of one: no next rank")
	}
	c.seq++
	c.buf = binary.LittleEndian.AppendUint32(append(c.buf[:0], kind), c.seq)
	c.buf = body(c.buf)
	c.c.SetWriteDeadline(time.Now().Add(l.Timeout))
	_, err := c.w.Write(c.buf)
	if err == nil {
		err = c.w.Flush()
	}
	if err != nil {
		return l.fail(fmt.Errorf("send to rank %d: %w", (l.rank+1)%l.ranks, err))
	}
	return nil
}

// recv reads the header of the previous rank's next message and checks it
// is the kind and number expected.
func (l *Link) recv(kind byte) (*conn, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	c := l.prev
	if c == nil {
		return nil, fmt.Errorf("ring of one: no previous rank")
	}
	c.seq++
	c.c.SetReadDeadline(time.Now().Add(l.Timeout))
	var h [5]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return nil, l.recvErr(err)
	}
	if got := binary.LittleEndian.Uint32(h[1:]); h[0] != kind || got != c.seq {
		return nil, l.fail(fmt.Errorf("out of step with rank %d: got message %q #%d, expected %q #%d", l.from(), h[0], got, kind, c.seq))
	}
	return c, nil
}

func (l *Link) from() int { return (l.rank + l.ranks - 1) % l.ranks }

func (l *Link) recvErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("connection closed (%w)", err)
	}
	return l.fail(fmt.Errorf("receive from rank %d: %w", l.from(), err))
}

// SendBlocks implements Transport.
func (l *Link) SendBlocks(bs []Block, kvd int) error {
	return l.send('B', func(buf []byte) []byte {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(bs)))
		for _, b := range bs {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(b.Start))
			buf = binary.LittleEndian.AppendUint32(buf, uint32(len(b.K)/kvd))
			buf = binary.LittleEndian.AppendUint32(buf, uint32(kvd))
			buf = appendFloats(appendFloats(buf, b.K), b.V)
		}
		return buf
	})
}

// maxBlocks bounds the blocks of one message.
const maxBlocks = 1 << 16

// RecvBlocks implements Transport.
func (l *Link) RecvBlocks(bs []Block, kvd int) ([]Block, error) {
	c, err := l.recv('B')
	if err != nil {
		return bs, err
	}
	var n [4]byte
	if _, err := io.ReadFull(c.r, n[:]); err != nil {
		return bs, l.recvErr(err)
	}
	count := int(binary.LittleEndian.Uint32(n[:]))
	if count > maxBlocks {
		return bs, l.fail(fmt.Errorf("%d blocks in one message from rank %d", count, l.from()))
	}
	for len(bs) < count {
		bs = append(bs, Block{})
	}
	bs = bs[:count]
	for i := range bs {
		if err := l.recvBlock(c, &bs[i], kvd); err != nil {
			return bs, err
		}
	}
	return bs, nil
}

func (l *Link) recvBlock(c *conn, b *Block, kvd int) error {
	var h [16]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return l.recvErr(err)
	}
	rows, got := int(binary.LittleEndian.Uint32(h[8:])), int(binary.LittleEndian.Uint32(h[12:]))
	if got != kvd || rows*kvd > maxFloats {
		return l.fail(fmt.Errorf("block of %d rows of %d floats from rank %d, expected rows of %d", rows, got, l.from(), kvd))
	}
	b.Start = int(int64(binary.LittleEndian.Uint64(h[:])))
	var err error
	if b.K, err = c.readFloats(b.K, rows*kvd); err == nil {
		b.V, err = c.readFloats(b.V, rows*kvd)
	}
	if err != nil {
		return l.recvErr(err)
	}
	return nil
}

// SendPartial implements Transport.
func (l *Link) SendPartial(p *Partial) error {
	return l.send('P', func(buf []byte) []byte {
		for _, v := range []int{p.Rows, p.NHead, p.NKVHead, p.HeadDim, p.Window} {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
		}
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(p.Scale))
		return appendFloats(appendFloats(appendFloats(buf, p.M), p.L), p.Acc)
	})
}

// RecvPartial implements Transport.
func (l *Link) RecvPartial(p *Partial) error {
	c, err := l.recv('P')
	if err != nil {
		return err
	}
	var h [24]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return l.recvErr(err)
	}
	u := func(i int) int { return int(binary.LittleEndian.Uint32(h[4*i:])) }
	s := Shape{NHead: u(1), NKVHead: u(2), HeadDim: u(3), Window: u(4), Scale: math.Float32frombits(binary.LittleEndian.Uint32(h[20:]))}
	rows := u(0)
	if err := s.Check(); err != nil || rows*s.QDim() > maxFloats {
		return l.fail(fmt.Errorf("partial of %d rows %+v from rank %d", rows, s, l.from()))
	}
	p.Shape, p.Rows = s, rows
	nh := rows * s.NHead
	if p.M, err = c.readFloats(p.M, nh); err == nil {
		if p.L, err = c.readFloats(p.L, nh); err == nil {
			p.Acc, err = c.readFloats(p.Acc, nh*s.HeadDim)
		}
	}
	if err != nil {
		return l.recvErr(err)
	}
	return nil
}

func appendFloats(b []byte, x []float32) []byte {
	for _, v := range x {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func (c *conn) readFloats(dst []float32, n int) ([]float32, error) {
	if cap(c.buf) < 4*n {
		c.buf = make([]byte, 4*n)
	}
	b := c.buf[:4*n]
	if _, err := io.ReadFull(c.r, b); err != nil {
		return dst, err
	}
	dst = grow(dst, n)
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return dst, nil
}
