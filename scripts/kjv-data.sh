#!/bin/sh
# Prepares the King James Bible (public domain: the 1611 translation's
# copyright has expired; see /usr/share/doc/bible-kjv-text/copyright) as
# training text for `pagoda train`, reproducibly.
#
#   scripts/kjv-data.sh [OUTDIR]     (default /work/train-run/kjv)
#
# Source: Debian package bible-kjv (the `bible` program) with its text in
# bible-kjv-text; version 4.38 (bookworm) was used for the shipped model.
# Cleaning, exactly: `bible -l100000 gen1:1-rev22:21` prints every verse
# on one line under a "Book N" chapter header; verse numbers (the leading
# "  N ") are removed, trailing spaces stripped, and each chapter becomes
# its header line, its verses one per line, and one blank line. Split: the
# chapters are numbered 0..1188 in canonical order and every 20th one
# (number mod 20 = 19) goes to heldout.txt, the rest to train.txt.
set -eu
out=${1:-/work/train-run/kjv}
if ! command -v bible >/dev/null 2>&1; then
	apt-get update && apt-get install -y bible-kjv
fi
mkdir -p "$out"
dpkg-query -W -f='${Package} ${Version}\n' bible-kjv bible-kjv-text >"$out/SOURCE"
bible -l100000 "gen1:1-rev22:21" | awk -v train="$out/train.txt" -v held="$out/heldout.txt" '
	function flush() { if (buf != "") { print buf > ((ch % 20 == 19) ? held : train); ch++ }; buf = "" }
	/^[^ ].* [0-9]+$/ { flush(); buf = $0 "\n"; next }
	/^ +[0-9]+ / { sub(/^ +[0-9]+ /, ""); sub(/ +$/, ""); buf = buf $0 "\n"; next }
	/^$/ { next }
	{ print "unexpected line: " $0 > "/dev/stderr"; exit 1 }
	END { flush(); print ch " chapters" > "/dev/stderr" }'
cd "$out" && sha256sum train.txt heldout.txt >>SOURCE && wc -c train.txt heldout.txt && cat SOURCE
