package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"strings"

	"pagoda/arch"
	"pagoda/quant"
	"pagoda/synth"
)

func init() {
	register("synth", "write a GGUF with a real architecture's shape and random weights (for tests and benchmarks)", runSynth)
}

func runSynth(args []string) error {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	preset := fs.String("preset", "tiny", "shape preset: "+strings.Join(synth.Presets(), ", ")+"; bert: a small BERT-family encoder (WordPiece, mean pooling) for embeddings")
	typ := fs.String("type", "F32", "tensor type of the 2-D weights (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K … Q6_K)")
	outType := fs.String("output-type", "", "tensor type of the output matrix (default: -type)")
	seed := fs.Int64("seed", 1, "random seed")
	std := fs.Float64("std", 0.02, "standard deviation of the weights")
	vocab := fs.String("vocab-from", "", "copy the vocabulary of this GGUF or llama2.c tokenizer.bin")
	out := fs.String("o", "", "output file (required)")
	archName := fs.String("arch", "", "override: architecture ("+strings.Join(arch.Names(), ", ")+")")
	layers := fs.Int("layers", 0, "override: layers (0 = the preset's)")
	dim := fs.Int("dim", 0, "override: embedding size (0 = the preset's)")
	heads := fs.Int("heads", 0, "override: attention heads (0 = the preset's)")
	kvHeads := fs.Int("kv-heads", 0, "override: KV heads (0 = the preset's)")
	headDim := fs.Int("head-dim", 0, "override: head dimension (0 = the preset's)")
	ffn := fs.Int("ffn", 0, "override: feed-forward size (0 = the preset's)")
	nVocab := fs.Int("vocab", 0, "override: vocabulary size (0 = the preset's)")
	ctx := fs.Int("ctx", 0, "override: context length (0 = the preset's)")
	mlaKVB := fs.Bool("mla-kvb", false, "MLA presets: write the older combined attn_kv_b layout that llama.cpp builds before mid-2025 read")
	if err := parseFlags(fs, args, []limit{
		{"layers", 0, 1 << 12}, {"dim", 0, 1 << 18}, {"heads", 0, 1 << 12}, {"kv-heads", 0, 1 << 12},
		{"head-dim", 0, 1 << 12}, {"ffn", 0, 1 << 20}, {"vocab", 0, 1 << 24}, {"ctx", 0, maxCtx}, {"std", 0, inf},
	}); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("-o FILE is required")
	}
	if *preset == "bert" {
		t, err := quant.ParseType(*typ)
		if err != nil {
			return err
		}
		b := synth.BERT{Layers: cmp.Or(*layers, 2), Embd: cmp.Or(*dim, 64), Heads: cmp.Or(*heads, 4), FFN: cmp.Or(*ffn, 256),
			Positions: cmp.Or(*ctx, 512), Pooling: 1, Type: t, Seed: *seed}
		if err := synth.WriteBERT(*out, b); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote %s: a BERT-family encoder, %d layers, width %d, %s\n", *out, b.Layers, b.Embd, t)
		return nil
	}
	shape, err := synth.Preset(*preset)
	if err != nil {
		return err
	}
	for _, o := range []struct {
		v   int
		dst *int
	}{{*layers, &shape.Layers}, {*dim, &shape.Dim}, {*heads, &shape.Heads}, {*kvHeads, &shape.KVHeads},
		{*headDim, &shape.HeadDim}, {*ffn, &shape.FFN}, {*nVocab, &shape.Vocab}, {*ctx, &shape.Context}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if *archName != "" {
		shape.Arch = *archName
	}
	shape.MLACombined = *mlaKVB
	o := synth.Options{Shape: shape, Seed: *seed, Std: float32(*std), VocabFrom: *vocab}
	if o.Type, err = quant.ParseType(*typ); err != nil {
		return err
	}
	if *outType != "" {
		if o.OutputType, err = quant.ParseType(*outType); err != nil {
			return err
		}
	}
	if err := synth.Write(*out, o); err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s: %s %s, %.1f M parameters, %.1f MB\n", *out, *preset, *typ, float64(shape.Params())/1e6, float64(st.Size())/1e6)
	return nil
}
