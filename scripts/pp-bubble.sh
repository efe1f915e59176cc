#!/usr/bin/env bash
# Measures pipeline parallelism with real processes on this machine: a
# synthetic 4-layer llama (d 512, ffn 1536, Q8_0) served in one process
# and by `serve --pipeline-parallel M` with k micro-batches per step, each
# loaded by `bench serve` (NUM prompts of IN tokens, OUT tokens each, all
# at once). Prints each server's throughput and, for the pipelines, the
# coordinator's shutdown line: the steps, micro-batches, the stages' busy
# time and the bubble fraction (1 − Σ busy / (stages × wall)).
# Usage: scripts/pp-bubble.sh ["M:k[:r[:v]] ..."]   (default "1 2:1 2:2 2:4 4:1 4:4"; r is
# --pipeline-min-rows, default 1 here so k is what the step is cut into; v is
# --pipeline-inflight, the engine steps in flight, default 1 here so the
# micro-batches' effect is measured alone)
# PAGODA names a pagoda binary (default: built from this checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${1:-"1 2:1 2:2 2:4 4:1 4:4"}
tmp=$(mktemp -d)
if [ -z "${PAGODA:-}" ]; then
	PAGODA=$tmp/pagoda
	go build -o "$PAGODA" ./cmd/pagoda
fi
model=$tmp/pp.gguf
"$PAGODA" synth -o "$model" -preset tiny -layers 4 -dim 512 -heads 8 -kv-heads 8 -head-dim 64 -ffn 1536 -type Q8_0 -ctx 1024 >/dev/null
threads=${THREADS:-2}
for c in $configs; do
	IFS=: read -r m k r v <<<"$c"
	args=(serve -m "$model" --port 0 --threads "$threads" --kv-cache-memory 64MiB)
	if [ "$m" != 1 ]; then
		args+=(--pipeline-parallel "$m" --pipeline-micro-batches "${k:-1}" --pipeline-min-rows "${r:-1}" --pipeline-inflight "${v:-1}")
	fi
	"$PAGODA" "${args[@]}" 2>"$tmp/serve.log" &
	pid=$!
	addr=
	for _ in $(seq 1 120); do
		addr=$(sed -n 's|.*serving .* on http://\([^ ]*\) .*|\1|p' "$tmp/serve.log" | head -1)
		[ -n "$addr" ] && break
		sleep 0.5
	done
	[ -n "$addr" ] || { cat "$tmp/serve.log"; kill "$pid"; exit 1; }
	echo "== ${args[*]:3}"
	"$PAGODA" bench serve --base-url "http://$addr" --num-prompts "${NUM:-8}" --input-len "${IN:-64}" --output-len "${OUT:-32}" \
		--vocab-size 512 --min-token-id 3 --scrape-metrics=false 2>&1 | grep -Ei 'throughput|duration' || true
	kill -TERM "$pid"
	wait "$pid" || true
	grep '^pipeline:' "$tmp/serve.log" || true
done
rm -rf "$tmp"
