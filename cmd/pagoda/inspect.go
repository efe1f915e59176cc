package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"pagoda/gguf"
	"pagoda/kvcache"
	"pagoda/model"
)

func init() {
	register("inspect", "print a model's architecture, hyper-parameters, tensor types, size and KV bytes per token", runInspect)
}

func runInspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	tokPath := fs.String("tokenizer", "", "tokenizer file to use instead of the model's own")
	meta := fs.Bool("meta", false, "also list every GGUF metadata key")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: pagoda inspect [flags] MODEL")
	}
	path := fs.Arg(0)
	m, err := model.Open(path, model.Options{Tokenizer: *tokPath, Threads: 1})
	if err != nil {
		return err
	}
	defer m.Close()
	c := m.Config
	w := os.Stdout
	fmt.Fprintf(w, "file          %s\n", path)
	fmt.Fprintf(w, "architecture  %s\n", c.Arch)
	fmt.Fprintf(w, "layers        %d\n", c.NLayer)
	fmt.Fprintf(w, "embedding     %d\n", c.NEmbd)
	if c.MLA {
		fmt.Fprintf(w, "heads         %d (MLA: q_lora %d, kv_lora %d, qk %d+%d, v %d; cache row %d for all heads)\n",
			c.NHead, c.QLoRA, c.KVLoRA, c.QKNope, c.QKRope, c.VHeadDim, c.KVLoRA+c.QKRope)
	} else {
		fmt.Fprintf(w, "heads         %d (KV heads %d, head dim %d; %s)\n", c.NHead, c.NKVHead, c.HeadDim, attnKind(c))
	}
	if c.NExpert > 0 && c.NDenseLead > 0 {
		fmt.Fprintf(w, "feed-forward  %d dense (first %d layers)\n", c.FFN, c.NDenseLead)
	} else if c.NExpert == 0 {
		fmt.Fprintf(w, "feed-forward  %d\n", c.FFN)
	}
	if c.NExpert > 0 {
		norm, scale := "", ""
		if c.ExpertNorm {
			norm = ", renormalised"
		}
		if c.ExpertScale != 0 && c.ExpertScale != 1 {
			scale = fmt.Sprintf(", ×%g", c.ExpertScale)
		}
		fmt.Fprintf(w, "experts       %d, %d used per token, width %d; %s gating%s%s", c.NExpert, c.NExpertUsed, c.ExpertFFN, c.Gating, norm, scale)
		if c.SharedFFN > 0 {
			fmt.Fprintf(w, "; shared width %d", c.SharedFFN)
			if c.SharedGate {
				fmt.Fprintf(w, " (sigmoid gate)")
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "vocabulary    %d\n", c.VocabSize)
	fmt.Fprintf(w, "context       %d\n", c.ContextLen)
	rope := "normal (adjacent pairs)"
	if c.RopeNeox {
		rope = "neox (half split)"
	}
	fmt.Fprintf(w, "rope          %s, θ %g, %d dims", rope, c.RopeTheta, c.RopeDim)
	if c.RopeFreqs != nil {
		fmt.Fprintf(w, ", rope_freqs")
	}
	if c.RopeScale != 1 {
		fmt.Fprintf(w, ", linear scale %g", c.RopeScale)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "rms epsilon   %g\n", c.RMSEps)
	if c.SlidingWindow > 0 {
		fmt.Fprintf(w, "sliding window %d\n", c.SlidingWindow)
	}
	fmt.Fprintf(w, "output        %s\n", map[bool]string{true: "tied to token embeddings", false: "separate matrix"}[c.TiedOutput])
	extras := []string{}
	if c.QKVBias {
		extras = append(extras, "q/k/v bias")
	}
	if c.QKNorm {
		extras = append(extras, "q/k RMSNorm")
	}
	if len(extras) > 0 {
		fmt.Fprintf(w, "extras        %s\n", strings.Join(extras, ", "))
	}
	fmt.Fprintf(w, "parameters    %d (%.2f M)\n", c.Params(), float64(c.Params())/1e6)
	types := map[string]int{}
	var bytes int64
	for _, mm := range m.W.Matrices() {
		types[mm.Type.String()]++
		bytes += int64(len(mm.Data))
	}
	keys := make([]string, 0, len(types))
	for k := range types {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, types[k]))
	}
	fmt.Fprintf(w, "matrices      %s (%.2f MB)\n", strings.Join(parts, ", "), float64(bytes)/1e6)
	f16, mha := c.KVBytesPerToken(kvcache.F16.Size())
	f32, _ := c.KVBytesPerToken(kvcache.F32.Size())
	fmt.Fprintf(w, "KV per token  %d bytes f16, %d bytes f32 (%.1f MB f16 at full context)",
		f16, f32, float64(f16*int64(c.ContextLen))/1e6)
	if c.MLA {
		fmt.Fprintf(w, "; MHA equivalent %d bytes f16 (%.1f× more)", mha, float64(mha)/float64(f16))
	}
	fmt.Fprintln(w)
	if tok := m.Tokenizer(); tok != nil {
		v := tok.Vocab()
		fmt.Fprintf(w, "tokenizer     %s (pre %q), %d tokens, BOS %d EOS %d, add BOS %v\n", v.Model, v.Pre, v.Size(), v.BOS, v.EOS, v.AddBOS)
		if v.ChatTemplate != "" {
			fmt.Fprintf(w, "chat template %d bytes\n", len(v.ChatTemplate))
		}
	} else {
		fmt.Fprintf(w, "tokenizer     none (pass --tokenizer FILE)\n")
	}
	if *meta && gguf.IsGGUF(path) {
		f, err := gguf.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		for _, kv := range f.KV {
			s := kv.Value.String()
			if len(s) > 120 {
				s = s[:117] + "..."
			}
			fmt.Fprintf(w, "  %-44s %s\n", kv.Key, s)
		}
	}
	return nil
}

func attnKind(c model.Config) string {
	switch {
	case c.NKVHead == 1:
		return "MQA"
	case c.NKVHead < c.NHead:
		return "GQA"
	}
	return "MHA"
}
