package progress

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newBar(w *bytes.Buffer, tty bool, c *fakeClock) *Bar {
	b := New(w, tty, "m.gguf")
	b.Verb, b.Past, b.Amount, b.Now = "loading", "loaded", Count, c.now
	return b
}

func TestPlain(t *testing.T) {
	c := &fakeClock{time.Unix(0, 0)}
	var buf bytes.Buffer
	b := newBar(&buf, false, c)
	b.Start(0, 8)
	for i := int64(1); i <= 8; i++ {
		c.add(500 * time.Millisecond)
		b.Update(i)
	}
	b.Finish(nil)
	want := "loading m.gguf (8)\n  m.gguf: 25% (2 of 8)\n  m.gguf: 50% (4 of 8)\n  m.gguf: 75% (6 of 8)\nloaded m.gguf: 8 in 4s (2/s)\n"
	if buf.String() != want {
		t.Errorf("plain progress:\n%q\nwant:\n%q", buf.String(), want)
	}
}

// A terminal gets at most five redraws a second, each with the rate and
// the ETA, and the line is cleared before the summary.
func TestTerminal(t *testing.T) {
	c := &fakeClock{time.Unix(0, 0)}
	var buf bytes.Buffer
	b := newBar(&buf, true, c)
	b.Start(0, 100)
	for i := int64(1); i <= 10; i++ {
		c.add(100 * time.Millisecond)
		b.Update(i * 5)
	}
	b.FinishWith(nil, "custom summary")
	want := "\r\x1b[Km.gguf  5 / 100    5%  50/s  ETA 2s" +
		"\r\x1b[Km.gguf  15 / 100   15%  50/s  ETA 2s" +
		"\r\x1b[Km.gguf  25 / 100   25%  50/s  ETA 2s" +
		"\r\x1b[Km.gguf  35 / 100   35%  50/s  ETA 1s" +
		"\r\x1b[Km.gguf  45 / 100   45%  50/s  ETA 1s" +
		"\r\x1b[Kcustom summary\n"
	if buf.String() != want {
		t.Errorf("terminal progress:\n%q\nwant:\n%q", buf.String(), want)
	}
}

// A Suffix follows the amounts on the terminal line.
func TestSuffix(t *testing.T) {
	c := &fakeClock{time.Unix(0, 0)}
	var buf bytes.Buffer
	b := newBar(&buf, true, c)
	loss := 4.5
	b.Suffix = func() string { return fmt.Sprintf("loss %.2f", loss) }
	b.Start(0, 100)
	c.add(time.Second)
	b.Update(10)
	loss = 3.25
	c.add(time.Second)
	b.Update(20)
	want := "\r\x1b[Km.gguf  10 / 100   10%  10/s  ETA 9s  loss 4.50" +
		"\r\x1b[Km.gguf  20 / 100   20%  10/s  ETA 8s  loss 3.25"
	if buf.String() != want {
		t.Errorf("terminal progress with suffix:\n%q\nwant:\n%q", buf.String(), want)
	}
}

// With a Delay, work that ends sooner prints nothing, and work that runs
// longer starts reporting once the delay has passed, without the quarters
// it missed.
func TestDelay(t *testing.T) {
	for _, tty := range []bool{false, true} {
		c := &fakeClock{time.Unix(0, 0)}
		var buf bytes.Buffer
		b := newBar(&buf, tty, c)
		b.Delay = time.Second
		b.Start(0, 4)
		c.add(900 * time.Millisecond)
		b.Update(4)
		b.Finish(nil)
		if buf.Len() != 0 {
			t.Errorf("tty %v: quick work printed %q", tty, buf.String())
		}
	}
	c := &fakeClock{time.Unix(0, 0)}
	var buf bytes.Buffer
	b := newBar(&buf, false, c)
	b.Delay = time.Second
	b.Start(0, 4)
	for i := int64(1); i <= 4; i++ {
		c.add(400 * time.Millisecond)
		b.Update(i)
	}
	b.Finish(nil)
	want := "loading m.gguf (4)\n  m.gguf: 75% (3 of 4)\nloaded m.gguf: 4 in 1.6s (2/s)\n"
	if buf.String() != want {
		t.Errorf("delayed progress:\n%q\nwant:\n%q", buf.String(), want)
	}
}

// A failure clears the line and prints no summary: the error says what
// happened.
func TestFailure(t *testing.T) {
	c := &fakeClock{time.Unix(0, 0)}
	var buf bytes.Buffer
	b := newBar(&buf, true, c)
	b.Start(0, -1)
	c.add(time.Second)
	b.Update(3)
	b.Finish(errors.New("disk full"))
	if want := "\r\x1b[Km.gguf  3  3/s\r\x1b[K"; buf.String() != want {
		t.Errorf("failed progress %q, want %q", buf.String(), want)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 30: "3.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
