package executor

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"pagoda/model"
)

// The wire form of a step is a frame: a little-endian uint32 length, then
// that many bytes, the first of which says what follows:
//
//	'S' StepInput:  u32 T, T×i32 tokens, T×i32 positions, T×i32 sequences,
//	                u8 has-marks, then (if 1) T bytes of 0/1 logits marks,
//	                u8 has-plan, then (if 1) the KV plan's Runs, TableOff,
//	                Tables, Slots, SpanOff, Spans, each u32 n, n×i32
//	                then, only when the step has any: 'X', u8 flags (1:
//	                hidden states wanted, 2: rotary positions present,
//	                4: top-k rows wanted, then u32 k; 8: the plan's
//	                notes follow), the rotary positions and the slot
//	                moves, each u32 n, n×i32, then the notes: u32 n, and
//	                per note u8 op, i32 seq, i32 n, u32 len + the policy
//	                string's bytes, u32 n + n×i32 block table
//	'K' reports:    u32 n, per report i32 seq, i32 sealed, u32 n + n×i32
//	                dead spans; then a 'T' or 'O' output
//	'O' StepOutput: u32 N, N×f32 logits (their IEEE bits, so bit-exact),
//	                then, when the executor measured it or hidden states
//	                follow, u64 busy nanoseconds, then for hidden states
//	                u32 H, H×f32
//	'T' top-k:      u32 N, N×i32 token ids, then an 'O' output whose
//	                logits are those ids' values
//	'E' error:      the error's text
//
// Fixed-width integers and raw float bits keep encoding a loop of
// appends: no reflection, and the same bytes on every machine.
const (
	kindStep   = 'S'
	kindOutput = 'O'
	kindError  = 'E'
	kindExt    = 'X'
	kindTop    = 'T'
	kindReport = 'K'

	// maxPolicyName bounds a note's policy string.
	maxPolicyName = 1 << 12

	// maxFrame bounds what a peer can make the reader allocate.
	maxFrame = 1 << 30
)

// AppendStep appends the encoding of in (without the frame length).
func AppendStep(dst []byte, in *StepInput) ([]byte, error) {
	if err := in.check(); err != nil {
		return dst, err
	}
	T := len(in.Tokens)
	dst = append(dst, kindStep)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(T))
	for _, s := range [][]int32{in.Tokens, in.Pos, in.Seq} {
		for _, v := range s {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
		}
	}
	if in.Logits == nil {
		dst = append(dst, 0)
	} else {
		dst = append(dst, 1)
		for _, l := range in.Logits {
			b := byte(0)
			if l {
				b = 1
			}
			dst = append(dst, b)
		}
	}
	if in.KV == nil {
		dst = append(dst, 0)
	} else {
		dst = append(dst, 1)
		for _, s := range planFields(in.KV) {
			dst = appendInts(dst, *s)
		}
	}
	notes := in.KV != nil && len(in.KV.Notes) > 0
	if in.Rope == nil && len(in.Moves) == 0 && !in.Hidden && in.TopK == 0 && !notes {
		return dst, nil
	}
	flags := byte(0)
	if in.Hidden {
		flags |= 1
	}
	if in.Rope != nil {
		flags |= 2
	}
	if in.TopK > 0 {
		flags |= 4
	}
	if notes {
		flags |= 8
	}
	dst = append(dst, kindExt, flags)
	if in.TopK > 0 {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(in.TopK))
	}
	dst = appendInts(dst, in.Rope)
	dst = appendInts(dst, in.Moves)
	if notes {
		dst = appendNotes(dst, in.KV.Notes)
	}
	return dst, nil
}

func appendNotes(dst []byte, notes []model.KVNote) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(notes)))
	for _, n := range notes {
		dst = append(dst, byte(n.Op))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(n.Seq))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(n.N))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(n.Policy)))
		dst = append(dst, n.Policy...)
		dst = appendInts(dst, n.Table)
	}
	return dst
}

// readNotes reads what appendNotes wrote into dst (reused), returning
// the rest of p.
func readNotes(p []byte, dst []model.KVNote) ([]byte, []model.KVNote, error) {
	if len(p) < 4 {
		return p, dst, errors.New("executor: KV notes truncated")
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n < 0 || n > len(p)/13 {
		return p, dst, fmt.Errorf("executor: %d KV notes in %d bytes", n, len(p))
	}
	dst = dst[:0]
	for range n {
		if len(p) < 13 {
			return p, dst, errors.New("executor: KV note truncated")
		}
		nt := model.KVNote{Op: model.KVOp(p[0]), Seq: int32(binary.LittleEndian.Uint32(p[1:])), N: int32(binary.LittleEndian.Uint32(p[5:]))}
		l := int(binary.LittleEndian.Uint32(p[9:]))
		p = p[13:]
		if l < 0 || l > maxPolicyName || l > len(p) {
			return p, dst, fmt.Errorf("executor: KV note's policy of %d bytes", l)
		}
		nt.Policy = string(p[:l])
		var err error
		if p, err = readInts(p[l:], &nt.Table, "KV note's block table"); err != nil {
			return p, dst, err
		}
		if len(nt.Table) == 0 {
			nt.Table = nil
		}
		dst = append(dst, nt)
	}
	return p, dst, nil
}

func appendInts(dst []byte, s []int32) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	for _, v := range s {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	return dst
}

// readInts reads what appendInts wrote into s (reused), returning the
// rest of p.
func readInts(p []byte, s *[]int32, what string) ([]byte, error) {
	if len(p) < 4 {
		return p, fmt.Errorf("executor: %s truncated", what)
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n < 0 || len(p)/4 < n {
		return p, fmt.Errorf("executor: %s truncated", what)
	}
	*s = growInts(*s, n)
	for i := range *s {
		(*s)[i] = int32(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return p[4*n:], nil
}

func planFields(p *model.KVPlan) [6]*[]int32 {
	return [6]*[]int32{&p.Runs, &p.TableOff, &p.Tables, &p.Slots, &p.SpanOff, &p.Spans}
}

// DecodeStep decodes what AppendStep wrote into in, reusing its slices.
func DecodeStep(p []byte, in *StepInput) error {
	if len(p) < 5 || p[0] != kindStep {
		return errors.New("executor: not a step")
	}
	T := int(binary.LittleEndian.Uint32(p[1:]))
	p = p[5:]
	if T < 0 || len(p) < 12*T+2 {
		return fmt.Errorf("executor: step of %d rows truncated (%d bytes)", T, len(p))
	}
	ints := func(s []int32) []int32 {
		s = growInts(s, T)
		for i := range s {
			s[i] = int32(binary.LittleEndian.Uint32(p[4*i:]))
		}
		p = p[4*T:]
		return s
	}
	in.Tokens = ints(in.Tokens)
	in.Pos = ints(in.Pos)
	in.Seq = ints(in.Seq)
	switch {
	case p[0] == 0:
		in.Logits = nil
		p = p[1:]
	case p[0] == 1 && len(p) >= 2+T:
		// Non-nil even with no rows: "marks present" and "no marks"
		// are different steps, and re-encoding must tell them apart.
		if in.Logits == nil {
			in.Logits = make([]bool, 0, T)
		}
		in.Logits = in.Logits[:0]
		for _, b := range p[1 : 1+T] {
			if b > 1 {
				return fmt.Errorf("executor: logits mark %d is not 0 or 1", b)
			}
			in.Logits = append(in.Logits, b == 1)
		}
		p = p[1+T:]
	default:
		return errors.New("executor: malformed logits marks")
	}
	switch {
	case len(p) >= 1 && p[0] == 0:
		in.KV = nil
		p = p[1:]
	case len(p) == 0 || p[0] != 1:
		return errors.New("executor: malformed KV plan")
	default:
		p = p[1:]
		if in.KV == nil {
			in.KV = new(model.KVPlan)
		}
		in.KV.Notes = in.KV.Notes[:0]
		for _, s := range planFields(in.KV) {
			var err error
			if p, err = readInts(p, s, "KV plan"); err != nil {
				return err
			}
		}
	}
	return decodeExt(p, in, T)
}

// decodeExt decodes the step's optional tail: the hidden-state request,
// rotary positions and slot moves.
func decodeExt(p []byte, in *StepInput, T int) error {
	in.Rope, in.Moves, in.Hidden, in.TopK = in.Rope[:0], in.Moves[:0], false, 0
	if len(p) == 0 {
		in.Rope = nil
		return nil
	}
	if len(p) < 2 || p[0] != kindExt || p[1] > 15 {
		return fmt.Errorf("executor: %d unexpected bytes after the KV plan", len(p))
	}
	flags := p[1]
	in.Hidden = flags&1 != 0
	p = p[2:]
	if flags&4 != 0 {
		if len(p) < 4 {
			return errors.New("executor: top-k truncated")
		}
		if in.TopK = int(binary.LittleEndian.Uint32(p)); in.TopK == 0 || in.TopK > MaxTopK {
			return fmt.Errorf("executor: top-k %d out of range [1, %d]", in.TopK, MaxTopK)
		}
		p = p[4:]
	}
	var err error
	if p, err = readInts(p, &in.Rope, "rotary positions"); err != nil {
		return err
	}
	switch {
	case flags&2 == 0 && len(in.Rope) != 0:
		return errors.New("executor: rotary positions the flags do not announce")
	case flags&2 == 0:
		in.Rope = nil
	case len(in.Rope) != T:
		return fmt.Errorf("executor: %d rotary positions for %d rows", len(in.Rope), T)
	}
	if p, err = readInts(p, &in.Moves, "slot moves"); err != nil {
		return err
	}
	if flags&8 != 0 {
		if in.KV == nil {
			return errors.New("executor: KV notes without a KV plan")
		}
		if p, in.KV.Notes, err = readNotes(p, in.KV.Notes); err != nil {
			return err
		}
		if len(in.KV.Notes) == 0 {
			return errors.New("executor: an empty list of KV notes")
		}
	}
	if len(p) != 0 {
		return fmt.Errorf("executor: %d bytes after the step", len(p))
	}
	if flags == 0 && len(in.Moves) == 0 {
		return errors.New("executor: an empty step extension")
	}
	return in.check()
}

func growInts(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// AppendOutput appends the encoding of out.
func AppendOutput(dst []byte, out *StepOutput) []byte {
	if len(out.KV) > 0 {
		dst = append(dst, kindReport)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out.KV)))
		for _, r := range out.KV {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Seq))
			dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Sealed))
			dst = appendInts(dst, r.Dead)
		}
	}
	if out.TopIDs != nil {
		dst = append(dst, kindTop)
		dst = appendInts(dst, out.TopIDs)
	}
	dst = append(dst, kindOutput)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out.Logits)))
	for _, v := range out.Logits {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	if out.Busy > 0 || len(out.Hidden) > 0 {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(out.Busy))
	}
	if len(out.Hidden) > 0 {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out.Hidden)))
		for _, v := range out.Hidden {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst
}

// AppendError appends the encoding of a step's error, which DecodeOutput
// returns as a *RemoteError.
func AppendError(dst []byte, err error) []byte {
	return append(append(dst, kindError), err.Error()...)
}

// DecodeOutput decodes what AppendOutput wrote (or an error frame, which
// it returns as the error) into out, reusing its slice.
func DecodeOutput(p []byte, out *StepOutput) error {
	if len(p) >= 1 && p[0] == kindError {
		return &RemoteError{Msg: string(p[1:])}
	}
	var err error
	if p, out.KV, err = readReports(p, out.KV); err != nil {
		return err
	}
	out.TopIDs = out.TopIDs[:0]
	if len(p) >= 1 && p[0] == kindTop {
		var err error
		if p, err = readInts(p[1:], &out.TopIDs, "top-k ids"); err != nil {
			return err
		}
		if out.TopIDs == nil {
			out.TopIDs = []int32{}
		}
	} else {
		out.TopIDs = nil
	}
	if len(p) < 5 || p[0] != kindOutput {
		return errors.New("executor: not a step output")
	}
	n := int(binary.LittleEndian.Uint32(p[1:]))
	p = p[5:]
	out.Busy = 0
	out.Hidden = out.Hidden[:0]
	if n >= 0 && len(p)/4 >= n && len(p) >= 4*n+8 {
		out.Busy = time.Duration(binary.LittleEndian.Uint64(p[4*n:]))
		rest := p[4*n+8:]
		p = p[:4*n]
		if len(rest) > 0 {
			if len(rest) < 4 || int(binary.LittleEndian.Uint32(rest)) != (len(rest)-4)/4 || len(rest)%4 != 0 {
				return fmt.Errorf("executor: output's hidden states have %d bytes", len(rest))
			}
			out.Hidden = floats(out.Hidden, rest[4:])
		}
	}
	if n < 0 || len(p) != 4*n {
		return fmt.Errorf("executor: output of %d logits has %d bytes", n, len(p))
	}
	if out.TopIDs != nil && len(out.TopIDs) != n {
		return fmt.Errorf("executor: %d top-k ids for %d logits", len(out.TopIDs), n)
	}
	if cap(out.Logits) < n {
		out.Logits = make([]float32, n)
	}
	out.Logits = out.Logits[:n]
	for i := range out.Logits {
		out.Logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return nil
}

// readReports reads an output's optional KV reports into dst (reused).
func readReports(p []byte, dst []model.KVReport) ([]byte, []model.KVReport, error) {
	if len(p) == 0 || p[0] != kindReport {
		return p, dst[:0], nil
	}
	if len(p) < 5 {
		return p, dst, errors.New("executor: KV reports truncated")
	}
	n := int(binary.LittleEndian.Uint32(p[1:]))
	p = p[5:]
	if n < 0 || n > len(p)/12 {
		return p, dst, fmt.Errorf("executor: %d KV reports in %d bytes", n, len(p))
	}
	dst = dst[:0]
	for range n {
		if len(p) < 12 {
			return p, dst, errors.New("executor: KV report truncated")
		}
		r := model.KVReport{Seq: int32(binary.LittleEndian.Uint32(p)), Sealed: int32(binary.LittleEndian.Uint32(p[4:]))}
		var err error
		if p, err = readInts(p[8:], &r.Dead, "KV report's dead blocks"); err != nil {
			return p, dst, err
		}
		if len(r.Dead)%2 != 0 {
			return p, dst, fmt.Errorf("executor: KV report of sequence %d has %d span ends", r.Seq, len(r.Dead))
		}
		dst = append(dst, r)
	}
	return p, dst, nil
}

func floats(dst []float32, p []byte) []float32 {
	n := len(p) / 4
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return dst
}

// RemoteError is an error the executor on the other end returned.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return "executor: remote: " + e.Msg }

// WriteFrame writes p as one frame (its length, then p) and flushes w:
// the framing of steps and outputs, for other streams of the same form
// (a pipeline's hidden states).
func WriteFrame(w *bufio.Writer, p []byte) error { return writeFrame(w, p) }

// ReadFrame reads one frame WriteFrame wrote, into buf when it fits.
func ReadFrame(r *bufio.Reader, buf []byte) ([]byte, error) { return readFrame(r, buf) }

func writeFrame(w *bufio.Writer, p []byte) error {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(p)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	return w.Flush()
}

func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return buf, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxFrame {
		return buf, fmt.Errorf("executor: frame of %d bytes exceeds %d", size, maxFrame)
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return buf, err
	}
	return buf, nil
}

// Remote is an Executor whose steps run on the far end of a byte stream
// (a pipe, a socket) where Serve answers them. Send and Receive split
// Execute for a caller that keeps several steps in flight (a pipeline):
// the far end answers them in order.
type Remote struct {
	mu         sync.Mutex // one Execute at a time, so each gets its own output
	wmu, rmu   sync.Mutex
	r          *bufio.Reader
	w          *bufio.Writer
	wbuf, rbuf []byte
}

// NewRemote is an executor that writes steps to w and reads their
// outputs from r.
func NewRemote(r io.Reader, w io.Writer) *Remote {
	return &Remote{r: bufio.NewReader(r), w: bufio.NewWriter(w)}
}

// Execute sends the step and waits for its output. The output's logits
// are a fresh slice the caller keeps.
func (x *Remote) Execute(in *StepInput) (StepOutput, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.Send(in); err != nil {
		return StepOutput{}, err
	}
	return x.Receive()
}

// Send writes one step without waiting for its output.
func (x *Remote) Send(in *StepInput) error {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	var err error
	if x.wbuf, err = AppendStep(x.wbuf[:0], in); err != nil {
		return err
	}
	if err := writeFrame(x.w, x.wbuf); err != nil {
		return fmt.Errorf("executor: send step: %w", err)
	}
	return nil
}

// Receive reads the output of the oldest step sent and not yet received.
func (x *Remote) Receive() (StepOutput, error) {
	x.rmu.Lock()
	defer x.rmu.Unlock()
	var err error
	if x.rbuf, err = readFrame(x.r, x.rbuf); err != nil {
		return StepOutput{}, fmt.Errorf("executor: read output: %w", err)
	}
	var out StepOutput
	if err := DecodeOutput(x.rbuf, &out); err != nil {
		return StepOutput{}, err
	}
	return out, nil
}

// Serve answers the steps read from r with ex, writing each output (or
// the step's error) to w, until r ends (nil) or the stream breaks. A
// malformed step is answered with an error and serving goes on.
func Serve(r io.Reader, w io.Writer, ex Executor) error {
	br, bw := bufio.NewReader(r), bufio.NewWriter(w)
	var buf, reply []byte
	var in StepInput
	for {
		var err error
		buf, err = readFrame(br, buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		reply = reply[:0]
		if err := DecodeStep(buf, &in); err != nil {
			reply = AppendError(reply, err)
		} else if out, err := ex.Execute(&in); err != nil {
			reply = AppendError(reply, err)
		} else {
			reply = AppendOutput(reply, &out)
		}
		if err := writeFrame(bw, reply); err != nil {
			return err
		}
	}
}
