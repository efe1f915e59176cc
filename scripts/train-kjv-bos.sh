#!/bin/sh
# Fine-tunes the KJV evaluation model (scripts/train-kjv.sh) on
# BOS-anchored windows, so it grows attention sinks (docs/train-kjv.md):
# every training and held-out window is <|endoftext|> and then 511 tokens
# from a random offset, where the first run drew 512 tokens from a random
# offset and so had no fixed first token. Weights and AdamW moments come
# from the first run's final state; the schedule starts again (warm-up 20
# steps to lr 6e-4, cosine to 6e-5 over TIME), the rest as in
# scripts/train-kjv.sh.
#
#   scripts/train-kjv-bos.sh [TIME]          fine-tune for TIME (default 65m)
#   RESUME=1 scripts/train-kjv-bos.sh [TIME] continue the fine-tune in $RUN
#
# FROM (default /work/train-run) is the first run's directory; it is not
# modified: its data and state are copied to $RUN (default
# /work/train-run-bos), where the fine-tune writes kjv-bos.gguf (F32,
# rewritten every 5 minutes), kjv-bos.state, kjv-bos.svg,
# kjv-bos.q8_0.gguf (final, Q8_0). Niced: the machine is shared.
set -eu
FROM=${FROM:-/work/train-run}
RUN=${RUN:-/work/train-run-bos}
TIME=${1:-65m}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$RUN"
[ -s "$RUN/kjv/train.txt" ] || cp -r "$FROM/kjv" "$RUN/"
(cd "$repo" && go build -o "$RUN/pagoda" ./cmd/pagoda)
mode="-resume"
if [ "${RESUME:-}" != 1 ]; then
	cp "$FROM/kjv.state" "$RUN/kjv-bos.state"
	mode="-resume -finetune"
fi
exec nice -n 19 "$RUN/pagoda" train $mode -bos \
	-data "$RUN/kjv/train.txt" -heldout "$RUN/kjv/heldout.txt" \
	-batch 4 -seq 512 -time "$TIME" -lr 6e-4 -min-lr 6e-5 -warmup 20 -wd 0.1 -clip 1 -seed 1 \
	-eval-every 50 -eval-windows 16 -log-every 5 -checkpoint-every 5m \
	-o "$RUN/kjv-bos.gguf" -q8 "$RUN/kjv-bos.q8_0.gguf"
