package cluster

import (
	"context"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// ppEngineV is ppEngine with inflight steps in flight (engine.Config
// InFlight).
func ppEngineV(t *testing.T, path string, addrs []string, micro, blocks, inflight int) (*engine.Engine, *Pipeline) {
	t.Helper()
	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coord.Close() })
	cfg := engine.ModelConfig(coord, "pp")
	cfg.KVBlocks = blocks
	cfg.InFlight = inflight
	var p *Pipeline
	cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
		var err error
		// A stage that waits on another fails the step within 20 s.
		p, err = ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: micro, Timeout: time.Minute,
			Exchange: 20 * time.Second})
		return p, err
	}
	eng, err := engine.New(nil, coord.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	t.Cleanup(func() {
		eng.Stop(context.Background())
		p.Close()
	})
	return eng, p
}

// slowWorkers starts n in-process workers whose stages sleep rowTime per
// row after computing (a device that takes no core), so steps overlap.
func slowWorkers(t *testing.T, path string, n int, rowTime time.Duration) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		w := &Worker{Model: path, Options: model.Options{Threads: 1}, JoinTimeout: 20 * time.Second, stageRowTime: rowTime}
		go w.Serve(ln)
		t.Cleanup(func() { ln.Close() })
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

var inflightPrompts = []string{
	"Once upon a time", "The little dog ran to the park and", "Lily", "Tom had a big red ball",
	"One day, a bird", "The sun was hot", "Sam and Mia went", "There was a cat",
}

// completions runs every prompt on eng at once, greedy, each request with
// n completions; odd prompts ask for log-probabilities (whole logits rows
// come back), even ones not (the last stage ships each row's top 1).
func completions(t *testing.T, eng *engine.Engine, tok tokenizer.Tokenizer, n, max int) []string {
	t.Helper()
	out := make([]string, len(inflightPrompts))
	var wg sync.WaitGroup
	for i, p := range inflightPrompts {
		ids := tok.Encode(p, tokenizer.Options{AddSpecial: true})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ch, err := eng.Submit(ctx, &engine.Request{Prompt: ids, N: n, MaxTokens: max, Sampling: sample.Params{Temperature: 0},
				Logprobs: i%2 == 1, TopLogprobs: 2 * (i % 2)})
			if err != nil {
				t.Error(err)
				return
			}
			toks := make([][]int32, n)
			tops := make([][]string, n)
			for ev := range ch {
				if ev.Err != nil {
					t.Error(ev.Err)
				}
				toks[ev.Index] = append(toks[ev.Index], ev.Tokens...)
				for _, tp := range ev.Top {
					tops[ev.Index] = append(tops[ev.Index], fmt.Sprint(tp))
				}
			}
			out[i] = fmt.Sprint(toks, tops)
		})
	}
	wg.Wait()
	return out
}

// TestPipelineInFlight: with steps in flight (as many as stages, and
// more), several requests at once — some forking 2 completions, some
// with log-probabilities — give exactly the single-process engine's
// greedy tokens and log-probabilities, and the pipeline did hold several
// steps at once. The stages sleep a little per row so steps overlap.
func TestPipelineInFlight(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, c := range []struct {
		file                    string
		stages, micro, inflight int
	}{
		{"g-llama3-ropefreqs.F32.gguf", 2, 1, 2},
		{"g-llama-mqa.F16.gguf", 3, 1, 3},
		{"g-llama-mqa.F16.gguf", 3, 2, 4},
		{"../../models/gguf/stories260K.gguf", 2, 2, 2},
	} {
		t.Run(fmt.Sprintf("%s/%dstages/%dmicro/%dinflight", c.file, c.stages, c.micro, c.inflight), func(t *testing.T) {
			path := filepath.Join(dir, c.file)
			whole, err := model.Open(path, model.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			ref := wholeEngine(t, whole, 96, 0)
			defer ref.Stop(context.Background())
			want := completions(t, ref, whole.Tokenizer(), 2, 20)

			eng, pl := ppEngineV(t, path, slowWorkers(t, path, c.stages, 200*time.Microsecond), c.micro, 96, c.inflight)
			got := completions(t, eng, whole.Tokenizer(), 2, 20)
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("%q: got %s\nwant %s", inflightPrompts[i], got[i], want[i])
				}
			}
			st := pl.Stats()
			if st.MaxInFlight < 2 {
				t.Errorf("at most %d step in flight, want %d", st.MaxInFlight, c.inflight)
			}
			t.Logf("%d steps, at most %d in flight: identical to one process; bubble %.2f", st.Steps, st.MaxInFlight, st.Bubble())
		})
	}
}

// TestPipelineInFlightCancel: requests cancelled at random points while
// their steps are in flight end without another token event after the
// cancellation's, leave no KV block held once every request is over, and
// the storage they leave gives the next requests exactly the
// single-process engine's tokens.
func TestPipelineInFlightCancel(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-mqa.F16.gguf")
	whole, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	tok := whole.Tokenizer()
	eng, pl := ppEngineV(t, path, slowWorkers(t, path, 3, time.Millisecond), 1, 48, 3)
	var wg sync.WaitGroup
	for i := range 24 {
		ids := tok.Encode(inflightPrompts[i%len(inflightPrompts)], tokenizer.Options{AddSpecial: true})
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := eng.Submit(ctx, &engine.Request{Prompt: ids, N: 1 + i%2, MaxTokens: 40, Sampling: sample.Params{Temperature: 0}, IgnoreEOS: true})
			if err != nil {
				t.Error(err)
				return
			}
			n := 0
			for ev := range ch {
				n += len(ev.Tokens)
				if n >= 1+i%7 {
					cancel() // mid-stream: a step of this request is in flight or about to be
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("cancelled requests did not end")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := eng.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.KV.Used == 0 && st.KV.Seqs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after every request was cancelled: %d running, %d waiting, %d blocks held by %d sequences", st.Running, st.Waiting, st.KV.Used, st.KV.Seqs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := pl.Stats()
	if st.MaxInFlight < 2 {
		t.Errorf("at most %d step in flight", st.MaxInFlight)
	}
	ref := wholeEngine(t, whole, 96, 0)
	defer ref.Stop(context.Background())
	want := completions(t, ref, tok, 1, 16)
	got := completions(t, eng, tok, 1, 16)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("after the cancellations, %q: got %s\nwant %s", inflightPrompts[i], got[i], want[i])
		}
	}
	t.Logf("%d steps, at most %d in flight; no block held after the cancellations", st.Steps, st.MaxInFlight)
}

// inflightWorkload drives a pipeline as the engine does with v steps in
// flight, without it: sets disjoint sets of seqs/sets sequences each,
// one prompt token each then decode tokens, a step per set in turn; a
// set's next step is submitted only after its previous one landed (it
// would need its sampled token), and at most v steps are in flight. Every
// step has seqs/sets rows, so the stages take equally long on each. It
// returns every step's logits in submission order.
func inflightWorkload(t *testing.T, p *Pipeline, kc kvcache.Config, vocab, seqs, sets, decode, v int) [][]float32 {
	t.Helper()
	mgr, err := kvcache.NewManager(kc)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		in   *executor.StepInput
		wait func() (executor.StepOutput, error)
	}
	var queue []step
	var out [][]float32
	land := func() {
		o, err := queue[0].wait()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]float32(nil), o.Logits...))
		queue = queue[1:]
	}
	for d := range decode + 1 {
		for set := range sets {
			in := &executor.StepInput{KV: new(model.KVPlan)}
			for s := set; s < seqs; s += sets {
				in.Tokens = append(in.Tokens, int32((s*131+d*17)%vocab))
				in.Pos = append(in.Pos, int32(d))
				in.Seq = append(in.Seq, int32(s))
				in.Logits = append(in.Logits, true)
				if !mgr.Allocate(int32(s), nil, 0, d+1) {
					t.Fatal("no room")
				}
			}
			if err := mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
				t.Fatal(err)
			}
			if len(queue) == v {
				land()
			}
			queue = append(queue, step{in, p.Submit(in)})
		}
	}
	for len(queue) > 0 {
		land()
	}
	return out
}

// TestPipelineInFlightBubble measures the bubble with v steps in flight
// through M stages of the simulated device (a sleep of 2 ms per row, as
// in TestPipelineBubbleSimulated), whole steps, each set of sequences'
// step submitted once its previous one landed. With one step in flight
// only one stage computes at a time: 1 − 1/M. With v ≥ M disjoint sets
// the stages stay busy but for filling and draining the pipe: S equal
// steps take (S + M − 1) stage-times, so the bubble is (M − 1)/(S + M − 1)
// plus the hand-offs and the coordinator's turnaround; with v < M at
// most v stages are busy at once, 1 − v/M. The test fails when the
// fastest of three runs leaves [bound − 0.02, bound + 0.12], and the
// logits must equal those of one step at a time bit for bit.
func TestPipelineInFlightBubble(t *testing.T) {
	path, coord, kc := simulatedPipeline(t)
	// Four sets of three sequences in every run, so the steps are the
	// same whatever is in flight.
	const seqs, sets, decode = 12, 4, 11
	for _, stages := range []int{2, 3} {
		addrs := slowWorkers(t, path, stages, 2*time.Millisecond)
		var want [][]float32
		for _, v := range []int{1, 2, 3, 4} {
			var st PipelineStats
			for range 3 {
				p, err := ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, MicroBatches: 1, Timeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				got := inflightWorkload(t, p, kc, coord.Config.VocabSize, seqs, sets, decode, v)
				if run := p.Stats(); st.Wall == 0 || run.Wall < st.Wall {
					st = run
				}
				p.Close()
				if v == 1 && want == nil {
					want = got
				}
				for i := range want {
					for j := range want[i] {
						if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
							t.Fatalf("%d stages, %d in flight: step %d logit %d is %g, one at a time %g", stages, v, i, j, got[i][j], want[i][j])
						}
					}
				}
			}
			S := float64(st.Steps)
			bound := float64(stages-1) / (S + float64(stages-1))
			if v < stages {
				bound = 1 - float64(v)/float64(stages)
			}
			t.Logf("%d stages, %d steps in flight (at most %d seen): %d steps in %v, stages busy %v, bubble %.3f (bound %.3f)",
				stages, v, st.MaxInFlight, st.Steps, st.Wall.Round(time.Millisecond), roundAll(st.Busy), st.Bubble(), bound)
			if st.Bubble() < bound-0.02 || st.Bubble() > bound+0.12 {
				t.Errorf("%d stages, %d steps in flight: bubble %.3f, bound %.3f", stages, v, st.Bubble(), bound)
			}
		}
	}
}

// TestPipelineInFlightRequestPolicies: requests with policies whose state
// lives on the stages (Quest, SnapKV, each a request's own) among plain
// ones, with two steps in flight asked for: while one of them runs the
// engine plans one step at a time (kvcache.Link.Following), before and
// after it two; every request gives the single-process engine's greedy
// tokens, and every block comes back.
func TestPipelineInFlightRequestPolicies(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	whole, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	tok := whole.Tokenizer()
	policies := []string{"", "", "quest:budget=8,dense=1", "", "snapkv:capacity=6,window=2,kernel=3", "", "", ""}
	run := func(eng *engine.Engine) []generated {
		out := make([]generated, len(inflightPrompts))
		var wg sync.WaitGroup
		for i, p := range inflightPrompts {
			ids := tok.Encode(p, tokenizer.Options{AddSpecial: true})
			wg.Go(func() {
				if i >= 2 {
					// The plain requests first, then the others join
					// while their steps are in flight.
					time.Sleep(time.Duration(i) * 15 * time.Millisecond)
				}
				out[i] = generatePolicy(t, eng, ids, 24, policies[i])
			})
		}
		wg.Wait()
		return out
	}
	ref := wholeEngine(t, whole, 256, 4)
	want := run(ref)
	ref.Stop(context.Background())

	coord, err := OpenStageShape(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	cfg := engine.ModelConfig(coord, "pp")
	cfg.KVBlocks, cfg.BlockSize, cfg.InFlight = 256, 4, 2
	addrs := slowWorkers(t, path, 2, time.Millisecond)
	var p *Pipeline
	cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
		p, err = ConnectPipeline(addrs, PipelineOptions{Model: &coord.Config, KV: kc, Threads: 1, Timeout: time.Minute, Exchange: 20 * time.Second})
		return p, err
	}
	eng, err := engine.New(nil, coord.Tokenizer(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start()
	defer func() {
		eng.Stop(context.Background())
		p.Close()
	}()
	got := run(eng)
	for i := range want {
		compareGreedy(t, inflightPrompts[i], want[i], got[i])
	}
	deadline := time.Now().Add(10 * time.Second)
	for eng.Stats().KV.Used != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u := eng.Stats().KV.Used; u != 0 {
		t.Errorf("%d blocks held after the requests", u)
	}
	st := p.Stats()
	if st.MaxInFlight < 2 {
		t.Errorf("at most %d step in flight: the plain requests never overlapped", st.MaxInFlight)
	}
	t.Logf("%d steps, at most %d in flight", st.Steps, st.MaxInFlight)
}
