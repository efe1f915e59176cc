#!/usr/bin/env bash
# On paper: Llama-2-70B at Q4_0 split across machines by tensor
# parallelism (TP = 2/4/8) or pipeline parallelism (PP = 2/4) on 10, 25
# and 100 Gbit/s links, from the formulas and inputs in docs/parallel.md
# ("Cost: collectives, bytes per token, and 70B across machines"). Every
# input is an environment variable; the defaults are the measured values
# (loopback, this machine) and the stated assumptions listed there.
# Usage: scripts/cost-70b.sh            (prints markdown tables)
#        ALPHA_LINK_US=50 BMEM_GBS=100 scripts/cost-70b.sh
set -euo pipefail
awk -v W_GB="${W_GB:-38.9}" -v P_B="${P_B:-68.98}" -v L="${LAYERS:-80}" -v D="${DMODEL:-8192}" -v V="${VOCAB:-32000}" \
	-v S_WIRE="${WIRE_BYTES:-2}" -v ALPHA_SW_US="${ALPHA_SW_US:-25.4}" -v ALPHA_LINK_US="${ALPHA_LINK_US:-20}" \
	-v BETA_ACT_NS="${BETA_ACT_NS:-1.12}" -v BETA_F32_NS="${BETA_F32_NS:-0.852}" \
	-v BMEM_GBS="${BMEM_GBS:-200}" -v F_TFLOPS="${F_TFLOPS:-5}" -v T_PRE="${PREFILL_TOKENS:-512}" -v K_MICRO="${MICRO:-8}" '
# t_ar: one all-reduce of m activation bytes (f32 size) among n machines,
# seconds: the full mesh sends the wire form (plus a 10-byte header) to
# each of the n-1 others over one link, and the host handles each
# peer'"'"'s copy (host: 1 with Pagoda'"'"'s measured per-byte cost, 0 for the
# link alone).
function t_ar(n, m, bl, host) {
	return alpha + (n - 1) * ((m * S_WIRE / 4 + 10) / bl + host * beta * m)
}
# the same with a ring all-reduce (reduce-scatter then all-gather, not
# implemented in Pagoda): 2(n-1) steps, each 1/n of the message
function t_ring(n, m, bl, host) {
	return 2 * (n - 1) * (alpha + (m * S_WIRE / 4 / n + 10) / bl + host * beta * m / n)
}
# the vocabulary-split head'"'"'s all-gather of one row of logits (f32)
function t_gather(n, bl, host) {
	return alpha + (n - 1) * ((4 * V / n + 10) / bl + host * beta32 * 4 * V / n)
}
# a stage hand-off (or the coordinator'"'"'s step out and logits back)
function t_hand(m, bl, host) { return alpha + (m * S_WIRE / 4 + 10) / bl + host * beta * m }
BEGIN {
	alpha = (ALPHA_SW_US + ALPHA_LINK_US) * 1e-6
	beta = BETA_ACT_NS * 1e-9
	beta32 = BETA_F32_NS * 1e-9
	W = W_GB * 1e9; Bm = BMEM_GBS * 1e9; F = F_TFLOPS * 1e12
	flop = 2 * P_B * 1e9   # per token
	nar = 2 * L + 1        # all-reduces per forward pass: 2 per layer + the embedding
	coord = 0              # filled per link
	printf "inputs: W = %.1f GB, %.2f B parameters, %d layers, d = %d, vocabulary %d; wire %d bytes/value\n", W_GB, P_B, L, D, V, S_WIRE
	printf "α = %.1f µs software (measured) + %.1f µs link (assumed); host β = %.3f ns per activation byte per peer (measured; f32 logits %.3f)\n", ALPHA_SW_US, ALPHA_LINK_US, BETA_ACT_NS, BETA_F32_NS
	printf "per machine: %.0f GB/s weight streaming, %.1f TFLOP/s prefill (assumed); prefill batch %d tokens, PP micro-batches %d\n\n", BMEM_GBS, F_TFLOPS, T_PRE, K_MICRO
	print "| split | link | decode: compute ms | comm ms | ms/token | tok/s | comm | tok/s, link alone | prefill " T_PRE ": compute s | comm s | tok/s | comm | ring: decode tok/s | ring: prefill tok/s |"
	print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
	split("10 25 100", links, " ")
	split("1 2 4 8", tps, " ")
	for (li = 1; li <= 3; li++) {
		bl = links[li] * 1e9 / 8
		for (ti = 1; ti <= 4; ti++) {
			n = tps[ti]
			cd = W / (n * Bm)
			cp = flop * T_PRE / (n * F)
			if (n == 1) {
				if (li > 1) continue
				printf "| one machine | — | %.1f | 0 | %.1f | %.2f | 0 | — | %.2f | 0 | %.1f | 0 | — | — |\n", cd * 1e3, cd * 1e3, 1 / cd, cp, T_PRE / cp
				continue
			}
			# the coordinator: the step out, rank 0'"'"'s logits back (f32)
			co = 2 * alpha + 4 * V / bl + beta32 * 4 * V
			md = nar * t_ar(n, 4 * D, bl, 1) + t_gather(n, bl, 1) + co
			md0 = nar * t_ar(n, 4 * D, bl, 0) + t_gather(n, bl, 0) + 2 * alpha + 4 * V / bl
			mp = nar * t_ar(n, 4 * D * T_PRE, bl, 1) + t_gather(n, bl, 1) + co
			rd = nar * t_ring(n, 4 * D, bl, 1) + t_gather(n, bl, 1) + co
			rp = nar * t_ring(n, 4 * D * T_PRE, bl, 1) + t_gather(n, bl, 1) + co
			printf "| TP=%d | %d Gbit/s | %.1f | %.1f | %.1f | %.2f | %.0f %% | %.2f | %.2f | %.2f | %.1f | %.0f %% | %.2f | %.1f |\n", n, links[li], cd * 1e3, md * 1e3, (cd + md) * 1e3, 1 / (cd + md), 100 * md / (cd + md), 1 / (cd + md0), cp, mp, T_PRE / (cp + mp), 100 * mp / (cp + mp), 1 / (cd + rd), T_PRE / (cp + rp)
		}
	}
	print ""
	print "| split | link | decode: ms/token (one step at a time) | tok/s | comm | tok/s, S groups in flight (not implemented) | prefill " T_PRE ", " K_MICRO " micro-batches: s | tok/s | bubble | comm |"
	print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
	split("2 4", pps, " ")
	for (li = 1; li <= 3; li++) {
		bl = links[li] * 1e9 / 8
		for (pi = 1; pi <= 2; pi++) {
			s = pps[pi]
			co = 2 * alpha + 4 * V / bl + beta32 * 4 * V
			cd = W / Bm
			md = (s - 1) * t_hand(4 * D, bl, 1) + co
			tok = cd + md
			# GPipe forward: k micro-batches through s stages take
			# (k + s - 1) slots of one micro-batch on one stage.
			slot = flop * T_PRE / (F * s * K_MICRO)
			hand = t_hand(4 * D * T_PRE / K_MICRO, bl, 1)
			tp = (K_MICRO + s - 1) * (slot + hand) + co
			printf "| PP=%d | %d Gbit/s | %.1f | %.2f | %.1f %% | %.2f | %.2f | %.1f | %.2f | %.1f %% |\n", s, links[li], tok * 1e3, 1 / tok, 100 * md / tok, s / tok, tp, T_PRE / tp, (s - 1) / (K_MICRO + s - 1), 100 * ((K_MICRO + s - 1) * hand + co) / tp
		}
	}
}'
