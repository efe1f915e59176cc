package main

import (
	"fmt"
	"os"
	"path/filepath"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/speed"
)

// benchGroup runs bench's tests through a tensor-parallel group, a
// pipeline or a sequence-parallel ring of worker processes (grp, from the serve/run flags): the
// coordinator plans every step's KV with a manager as the engine does,
// and the workers compute, so pp and tg measure the group's throughput
// as llama-bench measures one process's.
func benchGroup(grp *tp, path string, tests []speed.Test, reps, batch, ctx int) ([]*speed.Result, error) {
	// The whole model's size and parameters, for the table; its weights
	// are mapped, not read, and it is closed before the workers load.
	whole, err := model.Open(path, model.Options{Threads: 1, ContextLen: ctx})
	if err != nil {
		return nil, err
	}
	info := speed.InfoOf(whole)
	whole.Close()
	info.Context = ctx
	info.Threads = grp.threads * len(grp.addrs)
	coord, err := grp.openModel(path, model.Options{Threads: 1, ContextLen: ctx})
	if err != nil {
		return nil, err
	}
	defer coord.Close()
	maxTokens := 0
	for _, t := range tests {
		maxTokens = max(maxTokens, (t.Depth+t.N)*max(t.Seqs, 1))
	}
	c := &coord.Config
	kc := kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16, DType: kvcache.F32}
	kc.NumBlocks = maxTokens/kc.BlockSize + 1024/kc.BlockSize + 2
	ex, err := grp.executor(coord, ctx)(kc)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(path)
	switch {
	case grp.pipeline && grp.tensor > 1:
		name += fmt.Sprintf(" tp%dxpp%d", grp.tensor, len(grp.addrs)/grp.tensor)
	case grp.pipeline:
		name += fmt.Sprintf(" pp%d", len(grp.addrs))
	case grp.seq:
		name += fmt.Sprintf(" sp%d", len(grp.addrs))
	default:
		name += fmt.Sprintf(" tp%d", len(grp.addrs))
	}
	if grp.wire != 0 {
		name += " " + grp.wire.String()
	}
	var rs []*speed.Result
	for _, t := range tests {
		r, err := speed.RunExecutor(info, t, reps, batch, func(n, seqs int) (executor.Executor, error) {
			mgr, err := kvcache.NewManager(kc)
			if err != nil {
				return nil, err
			}
			return &planned{ex: ex, mgr: mgr, have: map[int32]int{}}, nil
		})
		if err != nil {
			return nil, err
		}
		r.Model = name
		rs = append(rs, r)
		fmt.Fprintf(os.Stderr, "%s: %.2f ± %.2f t/s\n", t, r.Mean, r.Stddev)
	}
	return rs, nil
}

// planned is an executor that plans each step's KV with a manager of its
// own (as the engine's scheduler does) before a group runs it.
type planned struct {
	ex   executor.Executor
	mgr  *kvcache.Cache
	have map[int32]int // positions each sequence holds
	step executor.StepInput
	plan model.KVPlan
}

func (p *planned) Execute(in *executor.StepInput) (executor.StepOutput, error) {
	upto := map[int32]int{}
	from := map[int32]int{}
	for i, s := range in.Seq {
		pos := int(in.Pos[i])
		if _, ok := from[s]; !ok {
			from[s] = pos
		}
		upto[s] = max(upto[s], pos+1)
	}
	for s, u := range upto {
		if u > p.have[s] {
			if !p.mgr.Allocate(s, nil, from[s], u) {
				return executor.StepOutput{}, fmt.Errorf("bench: the KV manager has no room for sequence %d up to %d", s, u)
			}
			p.have[s] = u
		}
	}
	if err := p.mgr.Plan(in.Pos, in.Seq, nil, &p.plan); err != nil {
		return executor.StepOutput{}, err
	}
	p.step = *in
	p.step.KV = &p.plan
	return p.ex.Execute(&p.step)
}
