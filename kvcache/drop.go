package kvcache

// DropCached forgets every block's registered content, as if each had
// been evicted (with a BlockRemoved event each), and says how many: the
// storage behind the blocks was replaced by an empty one (worker
// processes reconnected), so no prefix may be found in it any more. The
// blocks stay where they are: held ones with their holders, free ones in
// the free queue.
func (p *Pool) DropCached() int {
	n, ev := 0, p.Evictions
	for id := range p.blocks {
		b := &p.blocks[id]
		if !b.hashed {
			continue
		}
		if b.inFree {
			p.cachedFree--
		}
		p.uncache(int32(id))
		n++
	}
	p.Evictions = ev // nothing was pushed out for room
	return n
}

// Reset forgets the notes owed to the storage and its reports: the
// storage was replaced by an empty one that knows none of the
// sequences they are about.
func (l *Link) Reset() {
	l.notes = l.notes[:0]
	clear(l.reports)
}
