package engine

import "fmt"

// SoakCheck is for the soak test (package engine_test): once e has
// stopped, it checks that the scheduler holds no request and the KV cache
// no sequence, that its pages are released, and runs the KV cache's own
// invariant check. It waits for the loop goroutine to exit first, since
// that goroutine owns both.
func SoakCheck(e *Engine) error {
	<-e.done
	if n, w := len(e.sch.running), len(e.sch.waiting); n != 0 || w != 0 {
		return fmt.Errorf("scheduler still holds %d running and %d waiting sequences", n, w)
	}
	if u := e.kv.Usage(); u.Seqs != 0 || u.Used != 0 {
		return fmt.Errorf("KV cache still holds %d sequences and %d blocks", u.Seqs, u.Used)
	}
	if n := e.kv.MappedBytes(); n != 0 {
		return fmt.Errorf("the loop has ended but %d bytes of KV pages are still mapped", n)
	}
	if q := e.queued.Load(); q != 0 {
		return fmt.Errorf("queued counter is %d, want 0", q)
	}
	return e.kv.Check()
}
