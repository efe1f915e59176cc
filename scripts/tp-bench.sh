#!/usr/bin/env bash
# bench (llama-bench style pp/tg) of one process against tensor- and
# pipeline-parallel groups of 2 local worker processes (1 thread each),
# with f32 and f16 activations on the wire, on stories260K and a
# TinyLlama-shaped synthetic model of 4 layers (Q8_0, 307 M parameters).
# The load average is printed before each row: on a shared machine the
# numbers depend on it (docs/parallel.md, "bench with a group").
# Usage: scripts/tp-bench.sh   (PAGODA names a pagoda binary, default:
# built from this checkout; SHARED the shared test data, default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${PAGODA:-}" ]; then
	PAGODA=$tmp/pagoda
	go build -o "$PAGODA" ./cmd/pagoda
fi
S=${SHARED:-../shared}/models/gguf/stories260K.gguf
T=$tmp/tl4.gguf
"$PAGODA" synth -preset tinyllama-1.1b -layers 4 -type q8_0 -o "$T" >/dev/null
run() {
	echo "## $* (load $(cut -d' ' -f1-3 /proc/loadavg))"
	timeout 600 "$PAGODA" bench -bw 0 "$@" 2>/dev/null | grep '^| [st]'
}
for m in "$S -p 128 -n 64 -r 5" "$T -p 64 -n 16 -r 3"; do
	# shellcheck disable=SC2086
	set -- $m
	run -m "$@" -t 1
	run -m "$@" -t 2
	for g in "--tensor-parallel 2" "--pipeline-parallel 2"; do
		# shellcheck disable=SC2086
		run -m "$@" -t 2 $g
		# shellcheck disable=SC2086
		run -m "$@" -t 2 $g --wire-dtype f16
	done
done
echo "done (load $(cut -d' ' -f1-3 /proc/loadavg))"
