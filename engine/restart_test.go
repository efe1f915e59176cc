package engine

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"pagoda/executor"
	"pagoda/kvcache"
)

// restarting runs steps on storage of its own (a Follower, as a worker
// keeps) that it can replace by a new, empty one, as reconnected workers
// do: after step restartAt, the next Epoch installs fresh storage.
type restarting struct {
	fw        Forwarder
	kc        kvcache.Config
	mu        sync.Mutex
	kv        *kvcache.Follower
	steps     int
	restartAt int // 0: never
	epoch     uint64
	restarts  int
}

func (r *restarting) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps++
	return executor.NewLocal(r.fw, r.kv).Execute(in)
}

func (r *restarting) Epoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.restartAt > 0 && r.steps >= r.restartAt {
		r.kv.Close()
		kv, err := kvcache.NewFollower(r.kc)
		if err != nil {
			panic(err)
		}
		r.kv, r.restartAt = kv, 0
		r.epoch++
		r.restarts++
	}
	return r.epoch
}

func (r *restarting) restartAfter(steps int) {
	r.mu.Lock()
	r.restartAt = r.steps + steps
	r.mu.Unlock()
}

func startRestarting(t *testing.T) (*Engine, *restarting) {
	t.Helper()
	cfg := fakeConfig()
	cfg.KVBlocks = 64
	x := &restarting{fw: &fakeModel{}, epoch: 1}
	cfg.Executor = func(kc kvcache.Config) (executor.Executor, error) {
		kv, err := kvcache.NewFollower(kc)
		x.kc, x.kv = kc, kv
		return x, err
	}
	e, err := New(nil, newFakeTok(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() {
		e.Stop(t.Context())
		x.kv.Close()
	})
	return e, x
}

// TestRestartDropsPrefixCache: after the executor's storage is replaced,
// a prompt seen before finds nothing cached (its blocks hold nothing
// now) and gives the same tokens; without dropping the prefix cache it
// would attend over empty pages.
func TestRestartDropsPrefixCache(t *testing.T) {
	e, x := startRestarting(t)
	p := randPrompt(rand.New(rand.NewPCG(8, 9)), nil, 50)
	req := func() *Request { return &Request{Prompt: p, MaxTokens: 10, IgnoreEOS: true} }
	a := run(t, e, req())
	b := run(t, e, req())
	if b.usage.CachedTokens != 48 {
		t.Fatalf("second run cached %d tokens, want 48 (the check below needs a prefix hit to drop)", b.usage.CachedTokens)
	}
	x.restartAfter(0)
	c := run(t, e, req())
	if x.restarts != 1 || c.usage.CachedTokens != 0 {
		t.Fatalf("after %d restarts: %d tokens cached, want 0", x.restarts, c.usage.CachedTokens)
	}
	if fmt.Sprint(a.tokens) != fmt.Sprint(c.tokens) {
		t.Fatalf("after the restart: %v, want %v", c.tokens, a.tokens)
	}
	d := run(t, e, req()) // and the new storage's blocks are cached again
	if d.usage.CachedTokens != 48 || fmt.Sprint(a.tokens) != fmt.Sprint(d.tokens) {
		t.Fatalf("after the restart, a repeat cached %d tokens and gave %v, want 48 and %v", d.usage.CachedTokens, d.tokens, a.tokens)
	}
	e.Stop(t.Context())
	mustNoLeak(t, e)
}

// TestRestartRecomputesRunning: storage replaced while a request decodes
// (after its prefill and a few tokens) preempts it, so it is recomputed
// on the new storage and finishes with the tokens it gives undisturbed.
func TestRestartRecomputesRunning(t *testing.T) {
	e, x := startRestarting(t)
	rng := rand.New(rand.NewPCG(3, 4))
	p := randPrompt(rng, nil, 37)
	run(t, e, &Request{Prompt: p, MaxTokens: 24, IgnoreEOS: true}) // something cached, dropped by the restart
	q := randPrompt(rng, nil, 41)
	wantQ := run(t, e, &Request{Prompt: q, MaxTokens: 24, IgnoreEOS: true})
	x.restartAfter(6)
	got := run(t, e, &Request{Prompt: q, MaxTokens: 24, IgnoreEOS: true})
	if x.restarts != 1 {
		t.Fatalf("%d restarts, want 1", x.restarts)
	}
	if fmt.Sprint(got.tokens) != fmt.Sprint(wantQ.tokens) {
		t.Fatalf("restarted mid-decode: %v, want %v", got.tokens, wantQ.tokens)
	}
	if got.finish[0] != FinishLength {
		t.Fatalf("finish %v", got.finish[0])
	}
	e.Stop(t.Context())
	mustNoLeak(t, e)
}
