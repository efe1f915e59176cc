#!/usr/bin/env bash
# bench (pp/tg) of one process (2 threads) against TP=2, PP=2 (2 workers,
# 1 thread each) and TP=2×PP=2 (4 workers, 1 thread each), in interleaved
# rounds (every configuration once per round), on stories260K and a
# TinyLlama-shaped synthetic model of 4 layers (Q8_0, 307 M parameters);
# prints each test's median t/s over the rounds and its ratio to one
# process. On a 2-core machine TP=2×PP=2 oversubscribes the cores (4
# workers and the coordinator), so the ratios measure the protocol's
# cost there, not a speed-up (docs/parallel.md, "Tensor × pipeline
# parallelism").
# Usage: scripts/tpxpp-bench.sh [rounds]   (PAGODA names a pagoda binary,
# default: built from this checkout; SHARED the shared test data, default
# ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${PAGODA:-}" ]; then
	PAGODA=$tmp/pagoda
	go build -o "$PAGODA" ./cmd/pagoda
fi
S=${SHARED:-../shared}/models/gguf/stories260K.gguf
T=$tmp/tl4.gguf
"$PAGODA" synth -preset tinyllama-1.1b -layers 4 -type q8_0 -o "$T" >/dev/null
for m in "$S -p 128 -n 64 -r 5" "$T -p 64 -n 16 -r 3"; do
	# shellcheck disable=SC2086
	set -- $m
	tag=$(basename "$1" .gguf)
	for r in $(seq 1 "$rounds"); do
		echo "$tag round $r (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
		# shellcheck disable=SC2086
		{
			timeout 600 "$PAGODA" bench -bw 0 -m "$@" -t 2 --json >"$tmp/$tag.one.$r.json" 2>/dev/null
			timeout 600 "$PAGODA" bench -bw 0 -m "$@" -t 2 --tensor-parallel 2 --json >"$tmp/$tag.tp.$r.json" 2>/dev/null
			timeout 600 "$PAGODA" bench -bw 0 -m "$@" -t 2 --pipeline-parallel 2 --json >"$tmp/$tag.pp.$r.json" 2>/dev/null
			timeout 600 "$PAGODA" bench -bw 0 -m "$@" -t 4 --tensor-parallel 2 --pipeline-parallel 2 --json >"$tmp/$tag.grid.$r.json" 2>/dev/null
		}
	done
done
python3 - "$tmp" <<'PY'
import glob, json, os, statistics as st, sys
res = {}
for f in glob.glob(os.path.join(sys.argv[1], '*.json')):
    tag, mode, _, _ = os.path.basename(f).split('.')
    for x in json.load(open(f)):
        res.setdefault((tag, x['test'], mode), []).append(x['avg_ts'])
for tag, test in sorted({k[:2] for k in res}):
    one = st.median(res[(tag, test, 'one')])
    cells = [f"{mode} {st.median(res[(tag, test, mode)]):.1f} t/s ({st.median(res[(tag, test, mode)]) / one:.2f}x)" for mode in ('tp', 'pp', 'grid')]
    print(f"{tag} {test}: one process {one:.1f} t/s | " + " | ".join(cells))
PY
echo "done (load $(cut -d' ' -f1-3 /proc/loadavg))"
