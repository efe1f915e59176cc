#!/usr/bin/env bash
# Time of one all-reduce (2 and 4 ranks, f32 and f16 on the wire) and of
# one pipeline hand-off against the message size, 256 B to 16 MiB, over
# loopback TCP in one process (cluster.BenchmarkAllReduce,
# BenchmarkHandOff); prints per series the median over the runs, the
# effective GB/s (message bytes over the time) and the fit
# t = α + β·bytes (least squares on relative error, so the small sizes
# fix α and the large ones β). docs/parallel.md, "Cost: collectives,
# bytes per token, and 70B across machines".
# Usage: scripts/allreduce-bench.sh [count [benchtime [filter]]]
#   defaults: 3 runs of 100ms per size, all series; filter is a -bench
#   regexp, e.g. 'AllReduce/ranks=2'.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-3}
benchtime=${2:-100ms}
filter=${3:-'AllReduce|HandOff'}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
go test ./cluster -run '^$' -bench "$filter" -benchtime "$benchtime" -count "$count" >"$out"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E '^(cpu|goos|goarch):' "$out" || true
awk '
function bytes(s) {
	if (s ~ /MiB$/) return substr(s, 1, length(s) - 3) * 1048576
	if (s ~ /KiB$/) return substr(s, 1, length(s) - 3) * 1024
	return substr(s, 1, length(s) - 1) + 0
}
function median(key, k,   i, j, t, a) {
	for (i = 1; i <= k; i++) a[i] = v[key, i]
	for (i = 2; i <= k; i++)
		for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
/^Benchmark(AllReduce|HandOff)\// {
	name = $1
	sub(/-[0-9]+$/, "", name)
	i = index(name, "/size=")
	s = substr(name, 1, i - 1)
	b = bytes(substr(name, i + 6))
	ns = $3
	if (s ~ /^BenchmarkHandOff/) ns /= 2   # one op is two hand-offs
	if (!(s in seen)) { seen[s] = 1; order[++nser] = s }
	if (!((s, b) in have)) { have[s, b] = 1; cnt[s]++; size[s, cnt[s]] = b }
	n[s, b]++
	v[s SUBSEP b, n[s, b]] = ns
}
END {
	for (q = 1; q <= nser; q++) {
		s = order[q]
		S = Sx = Sy = Sxx = Sxy = 0
		for (j = 1; j <= cnt[s]; j++) {
			b = size[s, j]
			t = median(s SUBSEP b, n[s, b]) / 1000
			med[s, b] = t
			w = 1 / (t * t)
			S += w; Sx += w * b; Sy += w * t; Sxx += w * b * b; Sxy += w * b * t
		}
		beta = (S * Sxy - Sx * Sy) / (S * Sxx - Sx * Sx)
		alpha = (Sy - beta * Sx) / S
		label = s
		sub(/^Benchmark/, "", label)
		printf "\n%s (one %s; median of %d runs)\n\n", label, (s ~ /HandOff/ ? "hand-off, one way" : "all-reduce"), n[s, size[s, 1]]
		print "| bytes | µs | GB/s | fit µs |"
		print "| ---: | ---: | ---: | ---: |"
		for (j = 1; j <= cnt[s]; j++) {
			b = size[s, j]
			t = med[s, b]
			printf "| %d | %.1f | %.3f | %.1f |\n", b, t, b / t / 1000, alpha + beta * b
		}
		printf "\nfit: α = %.1f µs, β = %.3f ns/byte (1/β = %.3f GB/s)\n", alpha, beta * 1000, 1 / (beta * 1000)
	}
}' "$out"
