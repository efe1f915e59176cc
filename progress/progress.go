// Package progress draws the progress of long work (downloads, loading,
// quantizing) to a writer, normally stderr: on a terminal one line redrawn
// in place; otherwise, for logs, a line at each quarter. A summary line
// ends it.
package progress

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// Bar reports one piece of work measured in some unit (bytes, tensors).
// Its zero value is not usable; make one with New and adjust the fields
// before Start.
type Bar struct {
	// Verb starts the plain-mode first line ("pulling m.gguf"), Past the
	// summary ("pulled m.gguf: ...").
	Verb, Past string
	// Amount formats a quantity of the unit; Bytes by default.
	Amount func(int64) string
	// Delay holds back all output until the work has run this long, and a
	// bar that finishes sooner prints nothing: small models should load
	// as quietly as they always did.
	Delay time.Duration
	// Now is the clock; tests replace it.
	Now func() time.Time
	// Suffix, when set, is appended to the terminal line: the state of
	// the work beyond its amount (a training run's loss).
	Suffix func() string

	w    io.Writer
	tty  bool
	name string

	start       time.Time
	have, total int64 // amount done before Start (a resumed download); total, or -1
	done        int64
	shown       bool // something has been written
	lastDraw    time.Time
	nextQuarter int64 // the plain-mode quarter to report next, 1..3
}

// New returns a Bar for the work on name; tty selects the redrawn line.
func New(w io.Writer, tty bool, name string) *Bar {
	return &Bar{w: w, tty: tty, name: name, Verb: "working on", Past: "done", Amount: Bytes, Now: time.Now}
}

// StderrIsTerminal decides between a redrawn progress line and plain log
// lines: carriage returns make a mess of a log file or CI output.
func StderrIsTerminal() bool {
	st, err := os.Stderr.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// Start begins the work with have of total already done (total -1 when
// unknown).
func (b *Bar) Start(have, total int64) {
	b.start, b.have, b.total, b.done = b.Now(), have, total, have
	b.nextQuarter = 1
	if total > 0 {
		for b.nextQuarter < 4 && have*4 >= total*b.nextQuarter {
			b.nextQuarter++
		}
	}
	if b.Delay <= 0 {
		b.show()
	}
}

// show writes the plain-mode first line, once, when output begins.
func (b *Bar) show() {
	b.shown = true
	// Of the quarters passed while a Delay held the output back only the
	// latest is news.
	for b.total > 0 && b.nextQuarter < 3 && b.done*4 >= b.total*(b.nextQuarter+1) {
		b.nextQuarter++
	}
	if b.tty {
		return
	}
	msg := b.Verb + " " + b.name
	if b.total >= 0 {
		msg += " (" + b.Amount(b.total) + ")"
	}
	if b.have > 0 {
		msg += ", resuming at " + b.Amount(b.have)
	}
	fmt.Fprintln(b.w, msg)
}

// SetTotal sets the total once it is known, for work that starts before
// it can count its parts.
func (b *Bar) SetTotal(total int64) { b.total = total }

// Update reports done of the total done so far. Redraws are limited to
// five a second: a terminal fed every 1 MB write would flicker and cost
// time.
func (b *Bar) Update(done int64) {
	b.done = done
	t := b.Now()
	if !b.shown {
		if t.Sub(b.start) < b.Delay {
			return
		}
		b.show()
	}
	if b.tty {
		if t.Sub(b.lastDraw) >= 200*time.Millisecond {
			b.lastDraw = t
			fmt.Fprintf(b.w, "\r\x1b[K%s", b.line(t))
		}
		return
	}
	for b.total > 0 && b.nextQuarter < 4 && done*4 >= b.total*b.nextQuarter {
		fmt.Fprintf(b.w, "  %s: %d%% (%s of %s)\n", b.name, 25*b.nextQuarter, b.Amount(done), b.Amount(b.total))
		b.nextQuarter++
	}
}

// rate is the amount per second done since Start, not counting what was
// done before it, so a resumed download's speed is not inflated.
func (b *Bar) rate(el time.Duration) float64 {
	if el <= 0 {
		return 0
	}
	return float64(b.done-b.have) / el.Seconds()
}

// line is the terminal line for time t.
func (b *Bar) line(t time.Time) string {
	if b.Suffix != nil {
		return b.amountLine(t) + "  " + b.Suffix()
	}
	return b.amountLine(t)
}

func (b *Bar) amountLine(t time.Time) string {
	rate := b.rate(t.Sub(b.start))
	if b.total <= 0 {
		return fmt.Sprintf("%s  %s  %s/s", b.name, b.Amount(b.done), b.Amount(int64(rate)))
	}
	eta := "--"
	if rate > 0 {
		eta = time.Duration(float64(b.total-b.done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	return fmt.Sprintf("%s  %s / %s  %3d%%  %s/s  ETA %s", b.name, b.Amount(b.done), b.Amount(b.total),
		b.done*100/b.total, b.Amount(int64(rate)), eta)
}

// Elapsed is the time since Start.
func (b *Bar) Elapsed() time.Duration { return b.Now().Sub(b.start) }

// Finish ends the work: it clears the terminal line and, unless err is
// set or a Delay kept the bar quiet, writes the summary:
// "Past name: amount in time (rate/s)".
func (b *Bar) Finish(err error) {
	el := b.Elapsed()
	b.FinishWith(err, fmt.Sprintf("%s %s: %s in %s (%s/s)", b.Past, b.name, b.Amount(b.done),
		el.Round(time.Millisecond), b.Amount(int64(b.rate(el)))))
}

// FinishWith is Finish with the caller's summary line.
func (b *Bar) FinishWith(err error, summary string) {
	if b.tty && !b.lastDraw.IsZero() {
		fmt.Fprint(b.w, "\r\x1b[K")
	}
	if err != nil || b.start.IsZero() || !b.shown {
		return
	}
	if b.have > 0 {
		summary += ", resumed at " + b.Amount(b.have)
	}
	fmt.Fprintln(b.w, summary)
}

// Bytes formats n with a binary unit, e.g. "1.5 MiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[i])
}

// Count formats n as a plain number, for work counted in items.
func Count(n int64) string { return strconv.FormatInt(n, 10) }
