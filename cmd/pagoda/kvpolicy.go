package main

import (
	"bufio"
	"context"
	"fmt"

	"pagoda/engine"
	"pagoda/generate"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/tokenizer"
)

const kvPolicyHelp = "KV-cache policy: full (or none), streaming:sinks=4,window=256[,pos=shift,ctx=N], quest:budget=1024, h2o:heavy=0.1,recent=0.1, snapkv:capacity=1024 (streaming generates past the context)"

// kvPolicyFlag parses --kv-policy; apiCtx is the context length the API
// enforces: 0 (the engine decides) when the policy lets generation run
// past the model's context.
func kvPolicyFlag(s string, ctxLen int) (pol kvcache.Policy, apiCtx int, err error) {
	if s == "" {
		return nil, ctxLen, nil
	}
	pol, err = kvcache.ParsePolicy(s)
	if err == nil {
		err = kvcache.CheckContext(pol, ctxLen)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("--kv-policy: %v", err)
	}
	if u, ok := pol.(kvcache.Unbounded); ok && u.Unbounded() {
		return pol, 0, nil
	}
	return pol, ctxLen, nil
}

// runPolicy generates through the serving engine, whose paged cache runs
// the policy: with streaming, -n may exceed the context.
func runPolicy(ctx context.Context, m *model.Model, tok tokenizer.Tokenizer, ids []int32, policy string, o generate.Options, out *bufio.Writer, echo string) error {
	pol, _, err := kvPolicyFlag(policy, m.Config.ContextLen)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("the prompt is empty and the vocabulary adds no BOS token; give -p")
	}
	cfg := engine.ModelConfig(m, "run")
	cfg.KVPolicy = pol
	cfg.MaxNumSeqs = 1
	cfg.DisablePrefixCache = true
	// Room for what the policy lets one sequence hold while computing a
	// full step (or for the whole context), not a share of RAM.
	bs := kvcache.DefaultBlockSize
	blocks := pol.MaxBlocks(512, bs)
	if blocks == 0 {
		blocks = (m.Config.ContextLen+bs-1)/bs + 1
	}
	cfg.KVBlocks = blocks
	eng, err := engine.New(m, tok, cfg)
	if err != nil {
		return err
	}
	eng.Start()
	defer eng.Stop(context.Background())
	ch, err := eng.Submit(ctx, &engine.Request{Prompt: ids, MaxTokens: o.MaxTokens, Sampling: o.Sampling,
		StopStrings: o.StopStrings, IgnoreEOS: o.IgnoreEOS})
	if err != nil {
		return err
	}
	fmt.Fprint(out, echo)
	out.Flush()
	for ev := range ch {
		if ev.Err != nil {
			return ev.Err
		}
		fmt.Fprint(out, ev.Text)
		out.Flush()
	}
	fmt.Fprintln(out)
	return nil
}
