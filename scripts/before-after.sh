#!/bin/sh
# Speed before and after a change, interleaved: `pagoda bench` pp512/tg128
# and `pagoda bench serve` (32 prompts × 128/128 tokens, 8 in flight)
# against `pagoda serve`, both binaries in every round, alternating which
# goes first. The AFTER binary is the benchmark client for both servers.
#
#   scripts/before-after.sh BEFORE_BIN AFTER_BIN MODEL.gguf [ROUNDS]
#
# Each line is tagged with its binary, its round and the 1-minute load
# average when it started: a figure taken under load says so.
set -e
B=$1 A=$2 M=$3 R=${4:-3}
[ -x "$B" ] && [ -x "$A" ] && [ -f "$M" ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN MODEL.gguf [ROUNDS]" >&2; exit 2; }
one() {
	bin=$1 i=$2 port=$((18000 + i))
	echo "== round $i $(basename "$bin") load $(cut -d' ' -f1 /proc/loadavg)"
	"$bin" bench -m "$M" -p 512 -n 128 -r 2 -bw 0 -t 2 2>/dev/null | grep -E "pp|tg"
	"$bin" serve -m "$M" --port $port --threads 2 >/dev/null 2>&1 &
	pid=$!
	for _ in $(seq 1 240); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
	"$A" bench serve --base-url http://127.0.0.1:$port --num-prompts 32 --input-len 128 --output-len 128 \
		--max-concurrency 8 --vocab-size 32000 --min-token-id 100 2>/dev/null |
		grep -iE "output token throughput|Mean TTFT|Mean TPOT" || true
	kill $pid
	wait $pid 2>/dev/null || true
}
for i in $(seq 1 "$R"); do
	if [ $((i % 2)) = 1 ]; then one "$B" $i; one "$A" $i; else one "$A" $i; one "$B" $i; fi
done
