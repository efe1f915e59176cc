package executor

import "pagoda/model"

// MergeReports joins the KV reports of the parts of one model's storage
// (tensor-parallel ranks holding different KV heads, pipeline stages
// holding different layers) into what holds for the whole: a block is
// dead only where every part evicted it, and a sequence is sealed from
// the first position any part sealed. A sequence gets a report only when
// every part reported it; within a part, a later report of a sequence
// (a later micro-batch) replaces an earlier one.
func MergeReports(parts [][]model.KVReport) []model.KVReport {
	if len(parts) == 0 {
		return nil
	}
	last := func(p []model.KVReport) map[int32]model.KVReport {
		m := make(map[int32]model.KVReport, len(p))
		for _, r := range p {
			m[r.Seq] = r
		}
		return m
	}
	rest := make([]map[int32]model.KVReport, len(parts)-1)
	for i, p := range parts[1:] {
		rest[i] = last(p)
	}
	var out []model.KVReport
	seen := map[int32]bool{}
	for i := len(parts[0]) - 1; i >= 0; i-- {
		r := parts[0][i]
		if seen[r.Seq] {
			continue
		}
		seen[r.Seq] = true
		m := model.KVReport{Seq: r.Seq, Sealed: r.Sealed, Dead: r.Dead}
		ok := true
		for _, p := range rest {
			q, has := p[r.Seq]
			if !has {
				ok = false
				break
			}
			if q.Sealed >= 0 && (m.Sealed < 0 || q.Sealed < m.Sealed) {
				m.Sealed = q.Sealed
			}
			m.Dead = intersectSpans(m.Dead, q.Dead)
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// intersectSpans intersects two ascending lists of [from, to) pairs.
func intersectSpans(a, b []int32) []int32 {
	var out []int32
	for i, j := 0, 0; i+1 < len(a) && j+1 < len(b); {
		lo, hi := max(a[i], b[j]), min(a[i+1], b[j+1])
		if lo < hi {
			out = append(out, lo, hi)
		}
		if a[i+1] < b[j+1] {
			i += 2
		} else {
			j += 2
		}
	}
	return out
}
