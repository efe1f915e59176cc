package hub

import (
	"fmt"
	"io"
	"time"
)

// Bar draws a download's progress to w: on a terminal one line redrawn in
// place (bytes, percent, speed, ETA); otherwise, for logs, a line at each
// quarter. Either way a summary line ends it.
type Bar struct {
	w    io.Writer
	tty  bool
	name string
	now  func() time.Time

	start       time.Time
	have, total int64 // bytes on disk at start; size, or -1
	done        int64
	lastDraw    time.Time
	nextQuarter int64 // the plain-mode quarter to report next, 1..3
}

// NewBar returns a Bar for the file name; tty selects the redrawn line.
func NewBar(w io.Writer, tty bool, name string) *Bar {
	return &Bar{w: w, tty: tty, name: name, now: time.Now}
}

// Start implements Progress.
func (b *Bar) Start(have, total int64) {
	b.start, b.have, b.total, b.done = b.now(), have, total, have
	b.nextQuarter = 1
	if total > 0 {
		for b.nextQuarter < 4 && have*4 >= total*b.nextQuarter {
			b.nextQuarter++
		}
	}
	if b.tty {
		return
	}
	msg := fmt.Sprintf("pulling %s", b.name)
	if total >= 0 {
		msg += " (" + Bytes(total) + ")"
	}
	if have > 0 {
		msg += ", resuming at " + Bytes(have)
	}
	fmt.Fprintln(b.w, msg)
}

// Update implements Progress. Redraws are limited to five a second: a
// terminal fed every 1 MB write would flicker and cost time.
func (b *Bar) Update(done int64) {
	b.done = done
	t := b.now()
	if b.tty {
		if t.Sub(b.lastDraw) >= 200*time.Millisecond {
			b.lastDraw = t
			fmt.Fprintf(b.w, "\r\x1b[K%s", b.line(t))
		}
		return
	}
	for b.total > 0 && b.nextQuarter < 4 && done*4 >= b.total*b.nextQuarter {
		fmt.Fprintf(b.w, "  %s: %d%% (%s of %s)\n", b.name, 25*b.nextQuarter, Bytes(done), Bytes(b.total))
		b.nextQuarter++
	}
}

// line is the terminal line for time t.
func (b *Bar) line(t time.Time) string {
	el := t.Sub(b.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(b.done-b.have) / el
	}
	if b.total <= 0 {
		return fmt.Sprintf("%s  %s  %s/s", b.name, Bytes(b.done), Bytes(int64(rate)))
	}
	eta := "--"
	if rate > 0 {
		eta = (time.Duration(float64(b.total-b.done)/rate) * time.Second).Round(time.Second).String()
	}
	return fmt.Sprintf("%s  %s / %s  %3d%%  %s/s  ETA %s", b.name, Bytes(b.done), Bytes(b.total),
		b.done*100/b.total, Bytes(int64(rate)), eta)
}

// Finish implements Progress: the summary counts only this run's bytes,
// so a resumed download's speed is not inflated by what was on disk.
func (b *Bar) Finish(err error) {
	if b.tty && !b.lastDraw.IsZero() {
		fmt.Fprint(b.w, "\r\x1b[K")
	}
	if err != nil || b.start.IsZero() {
		return
	}
	el := b.now().Sub(b.start)
	got := b.done - b.have
	rate := 0.0
	if el > 0 {
		rate = float64(got) / el.Seconds()
	}
	msg := fmt.Sprintf("pulled %s: %s in %s (%s/s)", b.name, Bytes(b.done), el.Round(time.Millisecond), Bytes(int64(rate)))
	if b.have > 0 {
		msg += fmt.Sprintf(", resumed at %s", Bytes(b.have))
	}
	fmt.Fprintln(b.w, msg)
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
