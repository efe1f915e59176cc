#!/bin/sh
# Distils a draft for the KJV model and measures it against n-gram
# speculation and plain decoding where it is served (docs/eval/kjv/distill.md).
#
#   scripts/distill-kjv.sh            distil, then benchmark
#   BENCH_ONLY=1 scripts/distill-kjv.sh
#
# TARGET (default models/kjv3m.q8_0.gguf), DATA (default
# /work/train-run/kjv, from scripts/kjv-data.sh), OUT (default
# /work/train-run-bos/distill). Prompts for the samples: every 7th line of
# the training split with more than 3 words, 2,000 of them (the benchmark's
# prompts come from the held-out split). Niced: the machine is shared.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${TARGET:-$repo/models/kjv3m.q8_0.gguf}
DATA=${DATA:-/work/train-run/kjv}
OUT=${OUT:-/work/train-run-bos/distill}
mkdir -p "$OUT"
(cd "$repo" && go build -o "$OUT/pagoda" ./cmd/pagoda && go build -o "$OUT/specservebench" ./scripts/specservebench)
if [ "${BENCH_ONLY:-}" != 1 ]; then
	awk 'NR%7==0 && NF>3' "$DATA/train.txt" | head -2000 >"$OUT/prompts.txt"
	nice -n 19 "$OUT/pagoda" distill -m "$TARGET" -o "$OUT/kjv3m-draft.gguf" -prompts "$OUT/prompts.txt" \
		-samples 1024 -len 160 -steps 1000 -batch 8 -seq 128 -seed 1 2>&1 | tee "$OUT/distill.log"
fi
"$OUT/specservebench" -pagoda "$OUT/pagoda" -m "$TARGET" -draft "$OUT/kjv3m-draft.gguf" -text "$DATA/heldout.txt" \
	-setups plain,ngram,draft,ngram-fixed,draft-fixed -concurrency 1,8 -reps 5 \
	-num-prompts 32 -input-len 64 -output-len 192 -threads 2 | tee "$OUT/bench.out"
