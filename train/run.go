package train

import (
	"encoding/gob"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"
)

// Options are a training run's hyper-parameters.
type Options struct {
	Batch, Seq int // sequences per step and their length
	// Steps is the schedule's length. With Time set the schedule runs over
	// wall-clock training time instead (cosine decay by the fraction of
	// Time spent) and Steps, if set, only caps the run: on a shared machine
	// the step rate is not known in advance.
	Steps       int
	Time        time.Duration
	LR, MinLR   float64
	Warmup      int
	WeightDecay float64
	Clip        float64 // gradient-norm bound (0: none)
	Seed        uint64
	// BOS anchors every window, training and held-out, at BOSToken: the
	// token at position 0 is always the same one, which is what lets a
	// model grow attention sinks (StreamingLLM: a model trained on windows
	// at random offsets has no fixed first token to dump attention on).
	// The window then holds Seq-1 data tokens after it.
	BOS      bool
	BOSToken int32
}

// Validate reports options a run cannot use.
func (o Options) Validate(c Config) error {
	switch {
	case o.Batch <= 0 || o.Seq <= 1:
		return fmt.Errorf("train: batch %d and sequence length %d must be positive (length at least 2)", o.Batch, o.Seq)
	case o.Seq > c.Context:
		return fmt.Errorf("train: sequence length %d exceeds the context %d", o.Seq, c.Context)
	case o.Steps <= 0 && o.Time <= 0:
		return fmt.Errorf("train: set the number of steps or a time budget")
	case o.Steps < 0 || o.Time < 0 || o.Warmup < 0:
		return fmt.Errorf("train: steps %d, time %v, warm-up %d must not be negative", o.Steps, o.Time, o.Warmup)
	case !(o.LR > 0) || o.MinLR < 0 || o.MinLR > o.LR:
		return fmt.Errorf("train: learning rate %g (min %g) out of range", o.LR, o.MinLR)
	case o.WeightDecay < 0 || o.Clip < 0:
		return fmt.Errorf("train: weight decay %g and clip %g must not be negative", o.WeightDecay, o.Clip)
	case o.BOS && (o.BOSToken < 0 || int(o.BOSToken) >= c.Vocab):
		return fmt.Errorf("train: BOS token %d outside the vocabulary of %d", o.BOSToken, c.Vocab)
	}
	return nil
}

// Point is one entry of the loss history.
type Point struct {
	Step    int
	Tokens  int64
	Elapsed time.Duration
	Loss    float64 // training loss of the step
	LR      float64
	// HeldOut is the held-out loss measured after the step (HasHeldOut).
	HeldOut    float64
	HasHeldOut bool
}

// State is everything a run needs to continue exactly where it stopped:
// weights, optimizer moments, step, random state (which fixes the data
// position: batches are drawn from it), elapsed time and the history.
type State struct {
	Version int
	Config  Config
	Options Options
	Vocab   *Vocab
	Params  []float32
	M, V    []float32
	Step    int
	RNG     uint64
	Elapsed time.Duration
	Tokens  int64
	History []Point
	// SchedStep and SchedElapsed are where the current schedule began: 0
	// for a run trained in one schedule, the fine-tuning point after
	// FineTune. Steps, Time, warm-up and decay count from there.
	SchedStep    int
	SchedElapsed time.Duration
}

const stateVersion = 1

// Run is a training run over tokenized data.
type Run struct {
	State
	Model       *Model
	opt         *AdamW
	rng         *RNG
	train, held []int32
	in, tgt     []int32
}

// NewRun starts a run: the model initialised from the seed.
func NewRun(c Config, o Options, v *Vocab, train, held []int32, threads int) (*Run, error) {
	if err := o.Validate(c); err != nil {
		return nil, err
	}
	m, err := NewModel(c, threads)
	if err != nil {
		return nil, err
	}
	c.Init(m.Params, o.Seed)
	st := State{Version: stateVersion, Config: c, Options: o, Vocab: v, RNG: o.Seed ^ 0x5eed}
	return newRun(st, m, train, held)
}

func newRun(st State, m *Model, train, held []int32) (*Run, error) {
	o, c := st.Options, st.Config
	if len(train) < o.Seq+2 {
		return nil, fmt.Errorf("train: %d training tokens for sequences of %d", len(train), o.Seq)
	}
	for _, set := range [][]int32{train, held} {
		for _, t := range set {
			if t < 0 || int(t) >= c.Vocab {
				return nil, fmt.Errorf("train: data token %d outside the vocabulary of %d", t, c.Vocab)
			}
		}
	}
	r := &Run{State: st, Model: m, rng: &RNG{S: st.RNG}, train: train, held: held,
		in: make([]int32, o.Batch*o.Seq), tgt: make([]int32, o.Batch*o.Seq)}
	r.opt = NewAdamW(len(m.Params), o.WeightDecay)
	if st.M != nil {
		r.opt.M, r.opt.V, r.opt.Step = st.M, st.V, st.Step
	}
	r.State.Params, r.State.M, r.State.V = nil, nil, nil // live in Model and opt
	return r, nil
}

// sched is the step and training time into the current schedule.
func (r *Run) sched() (int, time.Duration) {
	return r.Step - r.SchedStep, r.Elapsed - r.SchedElapsed
}

// Done says whether the run has used its steps or its time.
func (r *Run) Done() bool {
	o := r.Options
	step, el := r.sched()
	return (o.Steps > 0 && step >= o.Steps) || (o.Time > 0 && el >= o.Time)
}

// LR is the learning rate of the next step.
func (r *Run) LR() float64 {
	o := r.Options
	step, el := r.sched()
	if o.Time <= 0 {
		return Schedule{Max: o.LR, Min: o.MinLR, Warmup: o.Warmup, Total: o.Steps}.At(step)
	}
	if step < o.Warmup {
		return o.LR * float64(step+1) / float64(o.Warmup)
	}
	f := min(1, float64(el)/float64(o.Time))
	return o.MinLR + 0.5*(o.LR-o.MinLR)*(1+math.Cos(math.Pi*f))
}

// Fraction is how far the current schedule is, in [0, 1].
func (r *Run) Fraction() float64 {
	o := r.Options
	step, el := r.sched()
	f := 0.0
	if o.Steps > 0 {
		f = float64(step) / float64(o.Steps)
	}
	if o.Time > 0 {
		f = max(f, float64(el)/float64(o.Time))
	}
	return min(1, f)
}

// window fills in and tgt (one sequence each) from data at offset at:
// with bos >= 0 the window is bos and then len(in)-1 data tokens, each
// position predicting the next data token; without, len(in) data tokens.
// The window needs len(in)+1 data tokens from at without bos, len(in)
// with it.
func window(in, tgt, data []int32, at int, bos int32) {
	if bos < 0 {
		copy(in, data[at:at+len(in)])
		copy(tgt, data[at+1:at+len(in)+1])
		return
	}
	in[0] = bos
	copy(in[1:], data[at:at+len(in)-1])
	copy(tgt, data[at:at+len(in)])
}

// bos is the token windows start with, -1 for none.
func (o Options) bos() int32 {
	if o.BOS {
		return o.BOSToken
	}
	return -1
}

// TrainStep draws a batch of random windows, takes one optimizer step and
// returns the batch's loss and the gradient norm before clipping.
func (r *Run) TrainStep() (loss, gradNorm float64, err error) {
	start := time.Now()
	o := r.Options
	for b := 0; b < o.Batch; b++ {
		at := r.rng.Intn(len(r.train) - o.Seq - 1)
		window(r.in[b*o.Seq:(b+1)*o.Seq], r.tgt[b*o.Seq:(b+1)*o.Seq], r.train, at, o.bos())
	}
	if loss, err = r.Model.Forward(r.in, r.tgt, o.Batch, o.Seq); err != nil {
		return 0, 0, err
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return 0, 0, fmt.Errorf("train: loss %v at step %d", loss, r.Step)
	}
	if err = r.Model.Backward(); err != nil {
		return 0, 0, err
	}
	gradNorm = ClipGradNorm(r.Model.Grads, o.Clip)
	lr := r.LR()
	r.opt.Update(r.Config, r.Model.Params, r.Model.Grads, lr)
	r.Step++
	r.Tokens += int64(o.Batch * o.Seq)
	r.Elapsed += time.Since(start)
	r.RNG = r.rng.S
	r.History = append(r.History, Point{Step: r.Step, Tokens: r.Tokens, Elapsed: r.Elapsed, Loss: loss, LR: lr})
	return loss, gradNorm, nil
}

// HeldOutLoss is the mean loss over up to windows consecutive,
// non-overlapping windows of the held-out tokens (the same ones every
// time), recorded on the last history point.
func (r *Run) HeldOutLoss(windows int) (float64, error) {
	loss, n, err := r.EvalHeldOut(windows)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("train: no held-out data")
	}
	if k := len(r.History); k > 0 {
		r.History[k-1].HeldOut, r.History[k-1].HasHeldOut = loss, true
	}
	return loss, nil
}

// EvalHeldOut is the mean loss over up to windows (0: all) held-out
// windows shaped as the training windows are (BOS-anchored when they
// are), and the number of windows used.
func (r *Run) EvalHeldOut(windows int) (float64, int, error) {
	return EvalLossBOS(r.Model, r.held, r.Options.Seq, r.Options.Batch, windows, r.Options.bos())
}

// EvalLoss is the mean next-token loss of m over up to windows
// consecutive windows of seq+1 tokens of data (0: all), batch at a time,
// and the number of windows used.
func EvalLoss(m *Model, data []int32, seq, batch, windows int) (float64, int, error) {
	return EvalLossBOS(m, data, seq, batch, windows, -1)
}

// EvalLossBOS is EvalLoss with every window starting with bos (>= 0) and
// then seq-1 data tokens, consecutive windows covering the data; bos < 0
// is EvalLoss.
func EvalLossBOS(m *Model, data []int32, seq, batch, windows int, bos int32) (float64, int, error) {
	stride := seq
	if bos >= 0 {
		stride = seq - 1
	}
	if stride < 1 {
		return 0, 0, fmt.Errorf("train: BOS-anchored windows of %d tokens hold no data", seq)
	}
	n := max(0, (len(data)-1)/stride)
	if windows > 0 {
		n = min(n, windows)
	}
	var sum float64
	in, tgt := make([]int32, batch*seq), make([]int32, batch*seq)
	for w := 0; w < n; w += batch {
		b := min(batch, n-w)
		for i := 0; i < b; i++ {
			window(in[i*seq:(i+1)*seq], tgt[i*seq:(i+1)*seq], data, (w+i)*stride, bos)
		}
		loss, err := m.Forward(in[:b*seq], tgt[:b*seq], b, seq)
		if err != nil {
			return 0, 0, err
		}
		sum += loss * float64(b)
	}
	if n == 0 {
		return 0, 0, nil
	}
	return sum / float64(n), n, nil
}

// Save writes the training state to path atomically (a temporary file
// renamed into place, so a run killed mid-write keeps its last state).
func (r *Run) Save(path string) error {
	st := r.State
	st.Params, st.M, st.V = r.Model.Params, r.opt.M, r.opt.V
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := gob.NewEncoder(tmp).Encode(&st); err != nil {
		tmp.Close()
		return fmt.Errorf("train: state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// LoadState reads a state written by Save.
func LoadState(path string) (*State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st State
	if err := gob.NewDecoder(f).Decode(&st); err != nil {
		return nil, fmt.Errorf("train: %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("train: %s: state version %d, want %d", path, st.Version, stateVersion)
	}
	return &st, nil
}

// Resume loads a state written by Save and continues it on the same data.
func Resume(path string, train, held []int32, threads int, change func(*Options)) (*Run, error) {
	st, err := LoadState(path)
	if err != nil {
		return nil, err
	}
	return ResumeState(st, train, held, threads, change)
}

// ResumeState continues a loaded state. change may alter the options that
// do not shape the data (a longer run: more steps or time); the batch,
// sequence length and BOS anchoring stay (FineTune changes them).
func ResumeState(st *State, train, held []int32, threads int, change func(*Options)) (*Run, error) {
	if change != nil {
		o := st.Options
		change(&o)
		if o.Batch != st.Options.Batch || o.Seq != st.Options.Seq {
			return nil, fmt.Errorf("train: resuming cannot change the batch (%d) or sequence length (%d)", st.Options.Batch, st.Options.Seq)
		}
		if o.BOS != st.Options.BOS || (o.BOS && o.BOSToken != st.Options.BOSToken) {
			return nil, fmt.Errorf("train: resuming cannot change the BOS anchoring of the windows (%v); fine-tune instead", st.Options.BOS)
		}
		if err := o.Validate(st.Config); err != nil {
			return nil, err
		}
		st.Options = o
	}
	return restore(st, train, held, threads)
}

// FineTune continues a loaded state's weights and optimizer moments under
// new options (other windows: BOS anchoring, batch, sequence length) and
// a new schedule: warm-up and decay start again at the state's step and
// training time, and o.Steps / o.Time count from there. The step count,
// token count and history go on, so the loss curve shows both parts.
func FineTune(st *State, o Options, train, held []int32, threads int) (*Run, error) {
	if err := o.Validate(st.Config); err != nil {
		return nil, err
	}
	st.Options, st.SchedStep, st.SchedElapsed = o, st.Step, st.Elapsed
	return restore(st, train, held, threads)
}

// restore builds the run of a loaded state.
func restore(st *State, train, held []int32, threads int) (*Run, error) {
	m, err := NewModel(st.Config, threads)
	if err != nil {
		return nil, err
	}
	if len(st.Params) != len(m.Params) || len(st.M) != len(m.Params) || len(st.V) != len(m.Params) {
		m.Close()
		return nil, fmt.Errorf("train: state has %d parameters and %d/%d moments for a model of %d", len(st.Params), len(st.M), len(st.V), len(m.Params))
	}
	copy(m.Params, st.Params)
	return newRun(*st, m, train, held)
}

// HeldOutData is the run's held-out tokens.
func (r *Run) HeldOutData() []int32 { return r.held }
