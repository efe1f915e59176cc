package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"pagoda/model"
	"pagoda/progress"
	"pagoda/speed"
)

// stderrIsTerminal decides between a redrawn progress line and plain log
// lines.
func stderrIsTerminal() bool { return progress.StderrIsTerminal() }

// fileSize is the size of path, or 0 when it cannot be read (a directory's
// size is not worth a walk for a progress line).
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil || st.IsDir() {
		return 0
	}
	return st.Size()
}

// sizeSummary is the summary line of work that produced or read size bytes:
// "past name: N items, S in T (S/s)".
func sizeSummary(past, name string, items int64, unit string, size int64, el time.Duration) string {
	s := fmt.Sprintf("%s %s: %d %s", past, name, items, unit)
	if size > 0 {
		s += ", " + progress.Bytes(size)
	}
	s += " in " + el.Round(time.Millisecond).String()
	if size > 0 && el > 0 {
		s += " (" + progress.Bytes(int64(float64(size)/el.Seconds())) + "/s)"
	}
	return s
}

// tensorBar returns a convert-style progress callback drawing to stderr and
// the function that ends it with a summary naming out's size.
func tensorBar(verb, past, out string) (func(done, total int), func(error)) {
	b := progress.New(os.Stderr, stderrIsTerminal(), filepath.Base(out))
	b.Verb, b.Past, b.Amount = verb, past, progress.Count
	b.Start(0, -1)
	var n int64
	update := func(done, total int) {
		if n == 0 {
			b.SetTotal(int64(total))
		}
		n = int64(total)
		b.Update(int64(done))
	}
	finish := func(err error) {
		b.FinishWith(err, sizeSummary(past, filepath.Base(out), n, "tensors", fileSize(out), b.Elapsed()))
	}
	return update, finish
}

// openModel is model.Open with a load bar on stderr, shown only once
// loading has taken a second: small models load as quietly as ever, and
// run's stdout stays the generated text alone.
func openModel(path string, o model.Options) (*model.Model, error) {
	b := progress.New(os.Stderr, stderrIsTerminal(), filepath.Base(path))
	b.Verb, b.Past, b.Amount, b.Delay = "loading", "loaded", progress.Count, time.Second
	b.Start(0, -1)
	var n int64
	o.Progress = func(done, total int) {
		if n == 0 {
			b.SetTotal(int64(total))
		}
		n = int64(total)
		b.Update(int64(done))
	}
	m, err := model.Open(path, o)
	sum := sizeSummary("loaded", filepath.Base(path), n, "matrices", fileSize(path), b.Elapsed())
	if mem, ok := speed.ReadMemory(); ok && err == nil {
		// Load stats: what the load left resident and its peak.
		sum += "; " + mem.String()
	}
	b.FinishWith(err, sum)
	return m, err
}
