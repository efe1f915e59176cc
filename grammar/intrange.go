package grammar

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// maxIntMag bounds integers without an explicit bound (maxIntDigits).
const maxIntMag = 999_999_999_999_999

// intRangeDFA accepts the decimal integers in [lo, hi] (no leading zeros,
// no "-0"), |lo|, |hi| <= maxIntMag.
func intRangeDFA(lo, hi int64) (*dfa, error) {
	if lo > hi {
		return nil, fmt.Errorf("empty range [%d, %d]", lo, hi)
	}
	// An NFA item: digit strings of length L in [a, b] (both L digits),
	// at position pos, still equal to a's prefix (tl) and/or b's (th).
	type item struct {
		a, b   string
		pos    int
		tl, th bool
	}
	var starts []item
	addMag := func(lo, hi int64) {
		// Magnitudes in [lo, hi], lo >= 0, split by length.
		for L := 1; L <= 16; L++ {
			minL, maxL := int64(0), int64(9)
			if L > 1 {
				minL = pow10(L - 1)
				maxL = pow10(L) - 1
			}
			a, b := max(lo, minL), min(hi, maxL)
			if a > b {
				continue
			}
			starts = append(starts, item{a: strconv.FormatInt(a, 10), b: strconv.FormatInt(b, 10), tl: true, th: true})
		}
	}
	if hi >= 0 {
		addMag(max(lo, 0), hi)
	}
	var negStarts []item
	if lo < 0 {
		starts0 := starts
		starts = nil
		addMag(max(1, -min(hi, -1)), -lo)
		negStarts, starts = starts, starts0
	}
	b := newBuilder256()
	ids := map[string]int32{}
	var queue [][]item
	key := func(set []item) string {
		parts := make([]string, len(set))
		for i, it := range set {
			parts[i] = fmt.Sprintf("%s,%s,%d,%v,%v", it.a, it.b, it.pos, it.tl, it.th)
		}
		slices.Sort(parts)
		return strings.Join(parts, ";")
	}
	accepting := func(set []item) bool {
		for _, it := range set {
			if it.pos == len(it.a) {
				return true
			}
		}
		return false
	}
	stateOf := func(set []item) int32 {
		k := key(set)
		if id, ok := ids[k]; ok {
			return id
		}
		id := b.state(accepting(set))
		ids[k] = id
		queue = append(queue, set)
		return id
	}
	start := b.state(false)
	queue = append(queue, nil) // placeholder for the start, handled below
	ids["start"] = start
	if len(negStarts) > 0 {
		b.on(start, '-', '-', stateOf(negStarts))
	}
	step := func(set []item, d byte) []item {
		var next []item
		for _, it := range set {
			if it.pos == len(it.a) {
				continue
			}
			lo, hi := byte('0'), byte('9')
			if it.tl {
				lo = it.a[it.pos]
			}
			if it.th {
				hi = it.b[it.pos]
			}
			if d < lo || d > hi {
				continue
			}
			next = append(next, item{a: it.a, b: it.b, pos: it.pos + 1, tl: it.tl && d == lo, th: it.th && d == hi})
		}
		return next
	}
	for d := byte('0'); d <= '9'; d++ {
		if next := step(starts, d); len(next) > 0 {
			b.on(start, d, d, stateOf(next))
		}
	}
	for q := 1; q < len(queue); q++ {
		set := queue[q]
		from := ids[key(set)]
		for d := byte('0'); d <= '9'; d++ {
			if next := step(set, d); len(next) > 0 {
				b.on(from, d, d, stateOf(next))
			}
		}
	}
	return b.build()
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// intBounds reads the integer bounds of s: [lo, hi] clamped to
// ±maxIntMag, ok false when s sets none.
func (c *compiler) intBounds(s *obj, path string) (lo, hi int64, ok bool, err error) {
	lo, hi = -maxIntMag, maxIntMag
	read := func(kw string) (float64, bool, error) {
		v, present := s.get(kw)
		if !present {
			return 0, false, nil
		}
		n, isNum := v.(json.Number)
		f, perr := n.Float64()
		if !isNum || perr != nil || math.IsInf(f, 0) {
			return 0, false, c.errf(path, kw, "must be a number, got %s", appendJSON(nil, v))
		}
		return f, true, nil
	}
	clamp := func(f float64) int64 { return int64(max(-maxIntMag, min(maxIntMag, f))) }
	for _, b := range []struct {
		kw    string
		apply func(f float64)
	}{
		{"minimum", func(f float64) { lo = max(lo, clamp(math.Ceil(f))) }},
		{"exclusiveMinimum", func(f float64) { lo = max(lo, clamp(math.Floor(f)+1)) }},
		{"maximum", func(f float64) { hi = min(hi, clamp(math.Floor(f))) }},
		{"exclusiveMaximum", func(f float64) { hi = min(hi, clamp(math.Ceil(f)-1)) }},
	} {
		f, present, err := read(b.kw)
		if err != nil {
			return 0, 0, false, err
		}
		if present {
			b.apply(f)
			ok = true
		}
	}
	if ok && lo > hi {
		return 0, 0, false, c.errf(path, "minimum", "no integer lies within the bounds (or they are beyond ±%d)", int64(maxIntMag))
	}
	return lo, hi, ok, nil
}
