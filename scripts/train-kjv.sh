#!/bin/sh
# Trains the KJV evaluation model (docs/train-kjv.md) from scratch, or
# continues it: the data from scripts/kjv-data.sh, a 2048-token byte-level
# BPE vocabulary trained on the training split, a 3.4M-parameter llama
# (4 layers, dim 256, 8 heads of 32, 4 KV heads, FFN 688, context 512,
# tied embedding), AdamW (lr 2e-3 → 2e-4, warm-up 30 steps, cosine over
# the time budget, weight decay 0.1, clip 1), batch 4 × 512.
#
#   scripts/train-kjv.sh [TIME]          start: train for TIME (default 100m)
#   RESUME=1 scripts/train-kjv.sh [TIME] continue the run in $RUN (TIME:
#                                         the new total training time)
#
# Everything goes to $RUN (default /work/train-run): kjv.gguf (F32
# checkpoint, rewritten every 5 minutes), kjv.state (resumable state),
# kjv.svg (loss curve), kjv.q8_0.gguf (final, Q8_0), train.log. The run is
# niced: the machine is shared.
set -eu
RUN=${RUN:-/work/train-run}
TIME=${1:-100m}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$RUN"
[ -s "$RUN/kjv/train.txt" ] || "$repo/scripts/kjv-data.sh" "$RUN/kjv"
(cd "$repo" && go build -o "$RUN/pagoda" ./cmd/pagoda)
resume=
[ "${RESUME:-}" = 1 ] && resume=-resume
exec nice -n 19 "$RUN/pagoda" train $resume \
	-data "$RUN/kjv/train.txt" -heldout "$RUN/kjv/heldout.txt" -vocab 2048 \
	-dim 256 -layers 4 -heads 8 -kv-heads 4 -head-dim 32 -ffn 688 -ctx 512 \
	-batch 4 -seq 512 -time "$TIME" -lr 2e-3 -min-lr 2e-4 -warmup 30 -wd 0.1 -clip 1 -seed 1 \
	-eval-every 50 -eval-windows 16 -log-every 5 -checkpoint-every 5m \
	-o "$RUN/kjv.gguf" -q8 "$RUN/kjv.q8_0.gguf"
