package hub

import (
	"io"

	"pagoda/progress"
)

// NewBar returns a progress bar for downloading the file name; tty selects
// the redrawn line. It implements Progress.
func NewBar(w io.Writer, tty bool, name string) *progress.Bar {
	b := progress.New(w, tty, name)
	b.Verb, b.Past = "pulling", "pulled"
	return b
}
