package executor

import (
	"io"
	"math"
	"slices"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
)

// kvSide is a KV manager and the executor that runs its steps: in this
// process over the manager's own storage, or over a byte pipe to a
// Follower that keeps the stateful policies.
type kvSide struct {
	mgr      *kvcache.Cache
	ex       Executor
	follower *kvcache.Follower
	close    func()
}

func newKVSide(t *testing.T, m *model.Model, kc kvcache.Config, remote bool) *kvSide {
	t.Helper()
	if !remote {
		c, err := kvcache.New(kc)
		if err != nil {
			t.Fatal(err)
		}
		return &kvSide{mgr: c, ex: NewLocal(m, c), close: func() { c.Close() }}
	}
	mgr, err := kvcache.NewManager(kc)
	if err != nil {
		t.Fatal(err)
	}
	f, err := kvcache.NewFollower(kc)
	if err != nil {
		t.Fatal(err)
	}
	toWorker, fromSched := io.Pipe()
	toSched, fromWorker := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Serve(toWorker, fromWorker, NewLocal(m, f))
		fromWorker.Close()
		done <- err
	}()
	return &kvSide{mgr: mgr, ex: NewRemote(toSched, fromSched), follower: f, close: func() {
		fromSched.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		f.Close()
	}}
}

// exec plans in on the manager, runs it and hands the reports back, as
// the engine's step does.
func (s *kvSide) exec(t *testing.T, in *StepInput) StepOutput {
	t.Helper()
	in.KV = new(model.KVPlan)
	if err := s.mgr.Plan(in.Pos, in.Seq, nil, in.KV); err != nil {
		t.Fatal(err)
	}
	out, err := s.ex.Execute(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.mgr.Link != nil {
		s.mgr.Link.Report(out.KV)
	}
	out.Logits = slices.Clone(out.Logits)
	return out
}

// followRun is a small serving run with one stateful policy as the cache's
// default and another bound to some sequences: prompts prefilled in
// chunks, greedy decoding, a fork, a speculative rollback, a sequence
// freed mid-run. It returns every step's logits, and the prefix-cache
// hashes and each sequence's released blocks at the end.
func followRun(t *testing.T, m *model.Model, kc kvcache.Config, bound kvcache.Policy, remote bool) (logits [][]float32, hashes []uint64, released map[int32][]int) {
	s := newKVSide(t, m, kc, remote)
	defer s.close()
	V := m.Config.VocabSize
	toks := map[int32][]int32{}
	done := map[int32]int{}
	for id, n := range map[int32]int{1: 37, 2: 29, 4: 41} {
		for i := range n {
			toks[id] = append(toks[id], int32((int(id)*131+i*17)%(V-3)+3))
		}
	}
	if err := s.mgr.Policies.Bind(2, bound); err != nil {
		t.Fatal(err)
	}
	if err := s.mgr.Policies.Bind(4, bound); err != nil {
		t.Fatal(err)
	}
	for id, tk := range toks {
		s.mgr.NotePrompt(id, len(tk))
	}
	live := []int32{1, 2, 4}
	for step := 0; step < 40; step++ {
		if step == 7 { // sequence 3 forks sequence 2 mid-block (copy-on-write)
			if err := s.mgr.Fork(2, 3); err != nil {
				t.Fatal(err)
			}
			toks[3], done[3] = slices.Clone(toks[2]), done[2]
			toks[3][len(toks[3])-1] = 7
			live = append(live, 3)
		}
		if step == 25 {
			s.mgr.Free(4)
			live = slices.DeleteFunc(live, func(id int32) bool { return id == 4 })
		}
		var in StepInput
		drafted := map[int32]bool{}
		for _, id := range live {
			n := min(len(toks[id])-done[id], 12) // chunked prefill
			if step%5 == 3 && n == 1 {           // a draft token rides along, to be rejected
				toks[id] = append(toks[id], 5)
				drafted[id], n = true, 2
			}
			if !s.mgr.Allocate(id, nil, done[id], done[id]+n) {
				t.Fatalf("step %d: no room for sequence %d", step, id)
			}
			for j := range n {
				p := done[id] + j
				in.Tokens, in.Pos, in.Seq = append(in.Tokens, toks[id][p]), append(in.Pos, int32(p)), append(in.Seq, id)
				in.Logits = append(in.Logits, j == n-1 || drafted[id])
			}
		}
		out := s.exec(t, &in)
		logits = append(logits, out.Logits)
		row := 0
		for _, id := range live {
			next := func() int32 { return int32(argmax(out.Logits[row*V : (row+1)*V])) }
			if drafted[id] {
				toks[id] = toks[id][:done[id]+1]
				s.mgr.Truncate(id, done[id]+1)
				done[id]++
				toks[id] = append(toks[id], next())
				row += 2
			} else {
				done[id] += min(len(toks[id])-done[id], 12)
				if done[id] == len(toks[id]) {
					toks[id] = append(toks[id], next())
				}
				row++
			}
			s.mgr.Commit(id, toks[id], done[id], 0)
		}
	}
	// A step of notes alone brings the last commits' reports back; commit
	// again to act on them.
	s.exec(t, &StepInput{})
	released = map[int32][]int{}
	for _, id := range live {
		s.mgr.Commit(id, toks[id], done[id], 0)
		for i, b := range s.mgr.Table(id) {
			if b < 0 {
				released[id] = append(released[id], i)
			}
		}
	}
	hashes = s.mgr.Pool().Hashes(nil)
	slices.Sort(hashes)
	for _, id := range live {
		s.mgr.Free(id)
	}
	if err := s.mgr.Pool().Check(); err != nil {
		t.Fatal(err)
	}
	if remote {
		s.exec(t, &StepInput{}) // the frees reach the follower
		if seqs, pols := s.follower.Policies.Bound(); seqs != 0 || pols != 0 {
			t.Errorf("the follower still binds %d sequences to %d policies", seqs, pols)
		}
	}
	return logits, hashes, released
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// TestPipeFollowsPolicies: H2O, SnapKV and Quest keep their state with
// the storage, on the far side of a byte pipe from a manager without
// storage; every step's logits equal the single-process run's bit for
// bit, the same prefix blocks are hashed, and the manager releases the
// same evicted blocks.
func TestPipeFollowsPolicies(t *testing.T) {
	m := loadModel(t)
	c := &m.Config
	h2o, snap, quest := kvcache.NewH2O(8, 8), kvcache.NewSnapKV(16, 4, 3), kvcache.NewQuest(8, 1)
	base := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 4, NumBlocks: 96, DType: kvcache.F32, Ops: m.Ops(), PrefixCache: true}
	// The same run with full attention: each policy must change it, or
	// the comparison below shows nothing.
	full, _, _ := followRun(t, m, base, nil, false)
	for _, tc := range []struct {
		name        string
		def, bound  kvcache.Policy
		wantRelease bool
	}{
		{"h2o+quest", h2o, quest, true},
		{"snapkv+h2o", snap, h2o, true},
		{"quest+snapkv", quest, snap, false}, // SnapKV's per-head choices rarely free a whole block
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := base
			kc.Policy = tc.def
			wl, wh, wr := followRun(t, m, kc, tc.bound, false)
			if slices.EqualFunc(wl, full, slices.Equal) {
				t.Fatal("the policies changed no logit")
			}
			gl, gh, gr := followRun(t, m, kc, tc.bound, true)
			if len(gl) != len(wl) {
				t.Fatalf("%d steps over the pipe, %d in process", len(gl), len(wl))
			}
			for i := range wl {
				if len(gl[i]) != len(wl[i]) {
					t.Fatalf("step %d: %d logits over the pipe, %d in process", i, len(gl[i]), len(wl[i]))
				}
				for j := range wl[i] {
					if math.Float32bits(gl[i][j]) != math.Float32bits(wl[i][j]) {
						t.Fatalf("step %d: logit %d: %v over the pipe, %v in process", i, j, gl[i][j], wl[i][j])
					}
				}
			}
			if !slices.Equal(gh, wh) {
				t.Errorf("prefix cache: %d hashes over the pipe, %d in process (or different ones)", len(gh), len(wh))
			}
			n := 0
			for id, w := range wr {
				n += len(w)
				if !slices.Equal(gr[id], w) {
					t.Errorf("sequence %d released blocks %v over the pipe, %v in process", id, gr[id], w)
				}
			}
			if tc.wantRelease && n == 0 {
				t.Errorf("no block was released: the run does not exercise eviction")
			}
		})
	}
}
