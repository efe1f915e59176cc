#!/usr/bin/env bash
# Reproduces docs/eval: the KV-policy papers' claims measured with
# `pagoda eval` on stories260K (the built-in model) and its own seeded
# samples. Usage: scripts/eval-policies.sh [OUT_DIR] (default docs/eval).
# PAGODA names a pagoda binary (default: built from this checkout).
# REGEN=1 samples the corpus anew even when OUT_DIR/corpus.txt exists.
# About 5 minutes on one core.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/eval}
mkdir -p "$out"
if [ -z "${PAGODA:-}" ]; then
	PAGODA=$(mktemp -d)/pagoda
	go build -o "$PAGODA" ./cmd/pagoda
fi
ev() { "$PAGODA" eval --threads 1 "$@"; }

# The corpus: 16 stories of 480 sampled tokens (temperature 1, seeds
# 1..16), about 7,800 tokens, the model's own distribution.
if [ ! -s "$out/corpus.txt" ] || [ -n "${REGEN:-}" ]; then
	: >"$out/corpus.txt"
	for s in $(seq 1 16); do
		"$PAGODA" run --threads 1 -p "Once upon a time" -n 480 --temp 1 --seed "$s" --ignore-eos >>"$out/corpus.txt" 2>/dev/null
		echo >>"$out/corpus.txt"
	done
fi
corpus=$out/corpus.txt

# 1a. StreamingLLM inside the trained context: 16 fresh 512-token streams
# (one per segment), caches of 64 (8x) and 32 (16x) tokens, window only
# against 4 sinks + window; the exact full cache is the reference.
ev -f "$corpus" --segment 512 --sink-mass 4 \
	--kv streaming:sinks=0,window=64,streaming:sinks=4,window=60,streaming:sinks=0,window=32,streaming:sinks=4,window=28 \
	--title "StreamingLLM: 16 fresh 512-token streams, caches of 64 (8x) and 32 (16x) tokens" \
	--curve "$out/streaming-512.svg" --curve-bin 32 --md "$out/streaming-512.md"

# The attention on the first tokens of the one stream that begins with BOS
# (the corpus's first 512 tokens), for the sinks question.
ev -f "$corpus" --max-tokens 512 --sink-mass 4 --kv streaming:sinks=0,window=64,streaming:sinks=4,window=60 \
	--md "$out/streaming-bos.md"

# 1b. Past the trained context: one 2048-token stream (4x the 512 tokens
# llama2.c trained on; the GGUF declares 2048, and --ctx 2048 says so for
# any copy that does not), so the full cache runs there too (its positions
# past 512 are RoPE extrapolation); caches of 128 (16x), and a
# 512-token window, the trained context sliding.
ev -f "$corpus" --ctx 2048 --max-tokens 2048 --sink-mass 4 \
	--kv streaming:sinks=0,window=128,streaming:sinks=4,window=124,streaming:sinks=0,window=512,streaming:sinks=4,window=508 \
	--title "StreamingLLM past the trained context (512): one 2048-token stream, --ctx 2048" \
	--curve "$out/streaming-2048.svg" --curve-bin 64 --md "$out/streaming-2048.md"

# 2. Equal token budgets over 512-token segments: a 448-token prompt in
# one pass (SnapKV compresses it), then 64 tokens teacher-forced one at a
# time and measured.
kv=""
for b in 64 128 256; do
	kv="$kv,quest:budget=$b,h2o:heavy=$((b / 2)),recent=$((b / 2)),snapkv:capacity=$b,streaming:sinks=0,window=$b,streaming:sinks=4,window=$((b - 4))"
done
ev -f "$corpus" --segment 512 --prefill 448 --kv "${kv#,}" \
	--title "Equal token budgets: 448-token prompt, 64 tokens decoded, 15 segments" \
	--svg-budget "$out/policies.svg" --md "$out/policies.md"

# 3. MiniCache by start layer, key channels (ThinK) by channels kept of 8.
ev -f "$corpus" --segment 512 \
	--kv minicache:from=3,minicache:from=2,minicache:from=1,minicache:from=0,channels:r=7,channels:r=6,channels:r=5,channels:r=4,channels:r=3,channels:r=2,channels:r=1 \
	--title "MiniCache by start layer, key channels (ThinK) by channels kept of 8" \
	--svg-saved "$out/layers.svg" --md "$out/layers.md"
