#!/usr/bin/env bash
# The KV-policy and KV-precision claims of docs/eval, measured on the KJV
# model (models/kjv3m.q8_0.gguf: 4 layers, 8 query heads and 4 KV heads of
# width 32, trained on 512-token windows) instead of stories260K.
# Usage: scripts/eval-kjv.sh [OUT_DIR] (default docs/eval/kjv).
# MODEL names the model (default models/kjv3m.q8_0.gguf), HELDOUT the
# held-out chapters (default /work/train-run/kjv/heldout.txt, made by
# scripts/kjv-data.sh), PAGODA a pagoda binary (default: built here).
# The text is real held-out text (chapters never trained on), not the
# model's samples. BOS=1 starts every segment (and the long stream) with
# <|endoftext|>, as a model fine-tuned on BOS-anchored windows
# (scripts/train-kjv-bos.sh) was trained; ONLY=streaming runs only the
# two StreamingLLM measurements (with the sink mass). About 16 minutes on
# two shared cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/eval/kjv}
model=${MODEL:-models/kjv3m.q8_0.gguf}
corpus=${HELDOUT:-/work/train-run/kjv/heldout.txt}
mkdir -p "$out"
if [ -z "${PAGODA:-}" ]; then
	PAGODA=$(mktemp -d)/pagoda
	go build -o "$PAGODA" ./cmd/pagoda
fi
ev() { "$PAGODA" eval -m "$model" --threads 2 -f "$corpus" ${BOS:+--bos} "$@"; }
N=8192 # tokens evaluated: 16 segments of 512

if [ "${ONLY:-}" != streaming ]; then
# KV precision: f16, q8_0, q4_0, KIVI 2-bit with per-channel keys (the
# paper's choice) against per-token keys, and KIVI 4-bit.
ev --max-tokens $N --segment 512 --kv f16,q8_0,q4_0,kivi2,kivi2:k=token,kivi4 \
	--title "KV precision on the KJV model: 16 held-out 512-token segments" --md "$out/precision.md"
fi

# 1a. StreamingLLM inside the trained context, with the sink mass.
ev --max-tokens $N --segment 512 --sink-mass 4 \
	--kv streaming:sinks=0,window=64,streaming:sinks=4,window=60,streaming:sinks=0,window=32,streaming:sinks=4,window=28 \
	--title "KJV StreamingLLM: 16 fresh 512-token streams, caches of 64 (8x) and 32 (16x)" \
	--curve "$out/streaming-512.svg" --curve-bin 32 --md "$out/streaming-512.md"

# 1b. Past the trained context: one 2048-token stream, --ctx 2048.
ev --ctx 2048 --max-tokens 2048 --sink-mass 4 \
	--kv streaming:sinks=0,window=128,streaming:sinks=4,window=124,streaming:sinks=0,window=512,streaming:sinks=4,window=508 \
	--title "KJV StreamingLLM past the trained context (512): one 2048-token stream" \
	--curve "$out/streaming-2048.svg" --curve-bin 64 --md "$out/streaming-2048.md"

[ "${ONLY:-}" = streaming ] && exit 0

# 2. Equal token budgets: a 448-token prompt in one pass, 64 tokens decoded.
kv=""
for b in 64 128 256; do
	kv="$kv,quest:budget=$b,h2o:heavy=$((b / 2)),recent=$((b / 2)),snapkv:capacity=$b,streaming:sinks=0,window=$b,streaming:sinks=4,window=$((b - 4))"
done
ev --max-tokens $N --segment 512 --prefill 448 --kv "${kv#,}" \
	--title "KJV equal token budgets: 448-token prompt, 64 tokens decoded, 16 segments" \
	--svg-budget "$out/policies.svg" --md "$out/policies.md"

# 3. MiniCache by start layer (from 2: a pair must fit below 4 layers), key
# channels (ThinK) by channels kept of 32.
ev --max-tokens $N --segment 512 \
	--kv minicache:from=2,minicache:from=1,minicache:from=0,channels:r=24,channels:r=16,channels:r=8,channels:r=4 \
	--title "KJV MiniCache by start layer, key channels (ThinK) by channels kept of 32" \
	--svg-saved "$out/layers.svg" --md "$out/layers.md"
