package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Progress hears how one download goes.
type Progress interface {
	// Start: have bytes were already on disk (a resumed download), total
	// is the file's size or -1 when unknown.
	Start(have, total int64)
	Update(done int64)
	// Finish is called once, with the download's outcome.
	Finish(err error)
}

type nopProgress struct{}

func (nopProgress) Start(int64, int64) {}
func (nopProgress) Update(int64)       {}
func (nopProgress) Finish(error)       {}

// ErrChecksum is wrapped by the error of a download whose content does
// not match the size or sha256 the hub reports.
var ErrChecksum = errors.New("downloaded file does not match the hub's checksum")

// Download fetches u into dest. The bytes go to dest.partial first, so an
// interrupted download is resumed by the next call (with a Range request)
// and dest only ever holds a complete, verified file. want.Size < 0 and
// want.SHA256 == "" mean unknown (a plain URL): nothing to check them by.
func (c *Client) Download(ctx context.Context, u, dest string, want File) (err error) {
	prog := Progress(nopProgress{})
	if c.Progress != nil {
		prog = c.Progress(path.Base(want.Path))
	}
	defer func() { prog.Finish(err) }()
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	partial := dest + partialSuffix
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if f == nil {
			return
		}
		// An empty partial file has nothing to resume; it would only litter.
		if st, serr := f.Stat(); f.Close() == nil && err != nil && serr == nil && st.Size() == 0 {
			os.Remove(partial)
		}
	}()
	h := sha256.New()
	have, err := resumeFrom(f, h, want.Size)
	if err != nil {
		return err
	}
	if want.Size < 0 || have < want.Size {
		if err := c.fetch(ctx, u, f, h, have, want.Size, prog); err != nil {
			return err
		}
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return cerr
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if (want.Size >= 0 && size != want.Size) || (want.SHA256 != "" && sum != want.SHA256) {
		// The bytes are wrong, not missing: resuming them cannot help.
		os.Remove(partial)
		return fmt.Errorf("%w: got %d bytes with sha256 %s, want %d bytes with sha256 %s", ErrChecksum, size, sum, want.Size, want.SHA256)
	}
	return os.Rename(partial, dest)
}

// resumeFrom hashes what a previous attempt left in f and leaves f's
// offset at its end. A partial file longer than the whole is not a prefix
// of it and is started over.
func resumeFrom(f *os.File, h hash.Hash, size int64) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	have := st.Size()
	if size >= 0 && have > size {
		if err := f.Truncate(0); err != nil {
			return 0, err
		}
		have = 0
	}
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, have)); err != nil {
		return 0, err
	}
	_, err = f.Seek(have, io.SeekStart)
	return have, err
}

// fetch appends the rest of u to f from offset have. A server that ignores
// the Range (200) sends the whole file, so f starts over; one that finds
// the Range past the end (416) has a different file than the partial one
// came from, so that is started over too.
func (c *Client) fetch(ctx context.Context, u string, f *os.File, h hash.Hash, have, size int64, prog Progress) error {
	hdr := http.Header{}
	if have > 0 {
		hdr.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	resp, err := c.get(ctx, u, hdr)
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusRequestedRangeNotSatisfiable && have > 0 {
		have = 0
		resp, err = c.get(ctx, u, nil)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusPartialContent {
		start, err := rangeStart(resp.Header.Get("Content-Range"))
		if err != nil || start != have {
			return fmt.Errorf("GET %s: asked for bytes from %d, got Content-Range %q", u, have, resp.Header.Get("Content-Range"))
		}
	} else {
		have = 0
	}
	if have == 0 {
		h.Reset()
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	total := size
	if total < 0 && resp.ContentLength >= 0 {
		total = have + resp.ContentLength
	}
	prog.Start(have, total)
	w := &progressWriter{w: io.MultiWriter(f, h), done: have, prog: prog}
	if _, err := io.CopyBuffer(w, resp.Body, make([]byte, 1<<20)); err != nil {
		return fmt.Errorf("download interrupted after %d bytes (kept %s; pull again to resume): %w", w.done, f.Name(), err)
	}
	if resp.ContentLength >= 0 && w.done != have+resp.ContentLength {
		return fmt.Errorf("download ended after %d of %d bytes (kept %s; pull again to resume)", w.done, have+resp.ContentLength, f.Name())
	}
	return nil
}

// rangeStart reads the first byte offset of "bytes START-END/TOTAL".
func rangeStart(cr string) (int64, error) {
	s, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", cr)
	}
	s, _, ok = strings.Cut(s, "-")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", cr)
	}
	return strconv.ParseInt(s, 10, 64)
}

type progressWriter struct {
	w    io.Writer
	done int64
	prog Progress
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.done += int64(n)
	p.prog.Update(p.done)
	return n, err
}
