package main

import (
	"fmt"

	"pagoda/progress"
)

// defaultKVFraction caps the sized default KV budget: the share of the
// memory available that the cache may take however many sequences of
// however long a context the model asks for.
const defaultKVFraction = 0.25

// kvBudget is the KV pool serve asks the engine for, and the sentence
// that says why it is that size.
type kvBudget struct {
	Blocks int   // pool blocks; 0 = as many as Bytes holds
	Bytes  int64 // pool bytes (Blocks × block bytes when Blocks is set)
	Report string
}

// kvSizing is what sizing a KV budget needs to know.
type kvSizing struct {
	BlockBytes int64 // one block, every layer, K and V
	BlockSize  int   // tokens a block
	Context    int   // tokens of one sequence's context
	Seqs       int   // sequences expected at once at full context (--kv-seqs)
	Residual   int64 // f16 room a sequence holds beside the pool (KIVI), times MaxSeqs
	Avail      int64 // memory available; 0 = unknown
	Formats    string
}

// perSeqBlocks is the blocks one full-context sequence takes: its tokens
// rounded up, and one more as the engine's own default counts, for the
// step that fills the last one.
func (z kvSizing) perSeqBlocks() int {
	return (z.Context+z.BlockSize-1)/z.BlockSize + 1
}

// sizedKVBudget sizes the default KV pool from the model (BlockBytes),
// its context and the sequences expected at once, capped at
// defaultKVFraction of the memory available, as llama-server sizes its
// cache from the context and slots rather than from the machine: a
// 260K-parameter model needs a few megabytes, not a quarter of the RAM.
func sizedKVBudget(z kvSizing) (kvBudget, error) {
	if z.BlockBytes <= 0 || z.BlockSize <= 0 || z.Context <= 0 || z.Seqs <= 0 {
		return kvBudget{}, fmt.Errorf("KV sizing: block %d bytes of %d tokens, context %d, %d sequences", z.BlockBytes, z.BlockSize, z.Context, z.Seqs)
	}
	per := z.perSeqBlocks()
	blocks := int64(per) * int64(z.Seqs)
	need := blocks*z.BlockBytes + z.Residual
	capBytes := int64(float64(z.Avail) * defaultKVFraction)
	head := fmt.Sprintf("KV cache %s, blocks of %d tokens (%s each)", z.Formats, z.BlockSize, progress.Bytes(z.BlockBytes))
	if z.Avail <= 0 || need <= capBytes {
		return kvBudget{Blocks: int(blocks), Bytes: blocks * z.BlockBytes,
			Report: fmt.Sprintf("%s: %d blocks = %s, sized for %d sequences (--kv-seqs) of the %d-token context",
				head, blocks, progress.Bytes(blocks*z.BlockBytes), z.Seqs, z.Context)}, nil
	}
	n := (capBytes - z.Residual) / z.BlockBytes
	if n < 1 {
		return kvBudget{}, fmt.Errorf("%.0f%% of the %s of memory available cannot hold one KV block (%s); give --kv-cache-memory",
			defaultKVFraction*100, progress.Bytes(z.Avail), progress.Bytes(z.BlockBytes))
	}
	fit := fmt.Sprintf("%d fit", n/int64(per))
	if n < int64(per) {
		// Serving still works: shorter requests fit, and the engine
		// refuses what never could.
		fit = fmt.Sprintf("not one does: at most %d tokens a sequence; lower --ctx or give --kv-cache-memory", n*int64(z.BlockSize))
	}
	return kvBudget{Blocks: int(n), Bytes: n * z.BlockBytes,
		Report: fmt.Sprintf("%s: %d blocks = %s, capped at %.0f%% of the %s available (%d sequences (--kv-seqs) of the %d-token context would need %s; %s)",
			head, n, progress.Bytes(n*z.BlockBytes), defaultKVFraction*100, progress.Bytes(z.Avail), z.Seqs, z.Context,
			progress.Bytes(need), fit)}, nil
}

// givenKVReport is the start-up line for a budget the user gave
// (--kv-cache-memory or --kv-cache-fraction).
func givenKVReport(formats string, blocks, blockSize int, blockBytes int64, context int, flag string) string {
	per := (context+blockSize-1)/blockSize + 1
	return fmt.Sprintf("KV cache %s, blocks of %d tokens (%s each): %d blocks = %s from %s (%d sequences of the %d-token context fit)",
		formats, blockSize, progress.Bytes(blockBytes), blocks, progress.Bytes(int64(blocks)*blockBytes), flag, blocks/per, context)
}
