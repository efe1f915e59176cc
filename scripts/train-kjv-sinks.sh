#!/bin/sh
# Trains the KJV evaluation model's shape from scratch on BOS-anchored
# windows (every training and held-out window is <|endoftext|> and then
# seq-1 tokens from a random offset), so a fixed first token is there from
# the first step: the condition under which attention sinks are reported
# to form during pre-training (Xiao et al. 2023, Gu et al. 2024). The
# fine-tune of scripts/train-kjv-bos.sh added BOS to a model trained
# without it and grew no sinks (docs/eval/kjv/streaming-bos-finetuned.md).
# Same data, vocabulary, shape and schedule as scripts/train-kjv.sh.
#
#   scripts/train-kjv-sinks.sh [TIME]          train for TIME (default 75m)
#   RESUME=1 scripts/train-kjv-sinks.sh [TIME] continue in $RUN
#
# DATA (default /work/train-run/kjv) is scripts/kjv-data.sh's output (made
# there if absent); RUN (default /work/train-run-sinks) gets kjv-sinks.gguf
# (F32, rewritten every 5 minutes), kjv-sinks.state, kjv-sinks.svg and
# kjv-sinks.q8_0.gguf (final). Niced: the machine is shared.
set -eu
DATA=${DATA:-/work/train-run/kjv}
RUN=${RUN:-/work/train-run-sinks}
TIME=${1:-75m}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$RUN"
[ -s "$DATA/train.txt" ] || "$repo/scripts/kjv-data.sh" "$DATA"
(cd "$repo" && go build -o "$RUN/pagoda" ./cmd/pagoda)
resume=
[ "${RESUME:-}" = 1 ] && resume=-resume
exec nice -n 19 "$RUN/pagoda" train $resume -bos \
	-data "$DATA/train.txt" -heldout "$DATA/heldout.txt" -vocab 2048 \
	-dim 256 -layers 4 -heads 8 -kv-heads 4 -head-dim 32 -ffn 688 -ctx 512 \
	-batch 4 -seq 512 -time "$TIME" -lr 2e-3 -min-lr 2e-4 -warmup 30 -wd 0.1 -clip 1 -seed 1 \
	-eval-every 50 -eval-windows 16 -log-every 5 -checkpoint-every 5m \
	-o "$RUN/kjv-sinks.gguf" -q8 "$RUN/kjv-sinks.q8_0.gguf"
