package executor

import "fmt"

// TopK reduces rows of logits (each len(logits)/rows wide) to each row's
// k largest, largest first and ties to the lower id (the order every
// reduction of a split vocabulary must reproduce, so that merging the
// ranks' top k gives exactly this). ids and vals are reused when they
// have room. A row narrower than k gives all of it.
func TopK(logits []float32, rows, k int, ids []int32, vals []float32) ([]int32, []float32, error) {
	if rows <= 0 || k <= 0 {
		return ids[:0], vals[:0], nil
	}
	if len(logits)%rows != 0 {
		return nil, nil, fmt.Errorf("executor: %d logits are not %d rows", len(logits), rows)
	}
	width := len(logits) / rows
	k = min(k, width)
	ids, vals = growInts(ids, rows*k), growFloats(vals, rows*k)
	for r := range rows {
		TopKRow(logits[r*width:(r+1)*width], 0, ids[r*k:(r+1)*k], vals[r*k:(r+1)*k])
	}
	return ids, vals, nil
}

// TopKRow fills ids and vals (len(ids) = len(vals) = k ≤ len(row)) with
// row's k largest values and their indices plus base, in TopK's order.
// Insertion into the kept k costs O(len(row)) when k is small, as it is
// for sampling.
func TopKRow(row []float32, base int32, ids []int32, vals []float32) {
	k := len(ids)
	n := 0
	for i, v := range row {
		if n == k && !before(v, int32(i), vals[k-1], ids[k-1]-base) {
			continue
		}
		j := min(n, k-1)
		for j > 0 && before(v, int32(i), vals[j-1], ids[j-1]-base) {
			vals[j], ids[j] = vals[j-1], ids[j-1]
			j--
		}
		vals[j], ids[j] = v, int32(i)+base
		n = min(n+1, k)
	}
}

// before: (v, i) ranks above (w, j) — a larger value, or the same value
// at a lower index. NaN ranks below everything, so a broken row does not
// crowd out real candidates.
func before(v float32, i int32, w float32, j int32) bool {
	vn, wn := v != v, w != w
	switch {
	case vn != wn:
		return wn
	case !vn && v != w:
		return v > w
	}
	return i < j
}

func growFloats(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
