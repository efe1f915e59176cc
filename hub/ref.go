// Package hub downloads GGUF models from the Hugging Face hub (or any
// https URL) into a local cache, resuming interrupted downloads and
// checking each file's size and sha256 against what the hub reports.
package hub

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Ref is what the user asked for: a hub repository with an optional
// quantization, or a direct URL.
type Ref struct {
	Owner, Repo string
	Quant       string   // "" lets Pick choose
	URL         *url.URL // set for a direct URL; Owner and Repo are then empty
}

// hubPrefixes are the spellings of a hub reference; both are what users
// copy from the hub's pages.
var hubPrefixes = []string{"hf.co/", "huggingface.co/"}

// IsRef reports whether s names a model to download rather than a local
// path.
func IsRef(s string) bool {
	for _, p := range append(hubPrefixes, "https://", "http://") {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// A name part may not be "." or ".." or carry a separator: it becomes a
// folder of the cache.
var namePart = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

func validPart(s string) bool {
	return namePart.MatchString(s) && s != "." && s != ".."
}

// ParseRef reads hf.co/OWNER/REPO[:QUANT] (huggingface.co/ also) or an
// http(s) URL.
func ParseRef(s string) (Ref, error) {
	if strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "http://") {
		u, err := url.Parse(s)
		if err != nil {
			return Ref{}, fmt.Errorf("model URL %q: %w", s, err)
		}
		if u.Host == "" || path.Base(u.Path) == "/" || path.Base(u.Path) == "." {
			return Ref{}, fmt.Errorf("model URL %q names no file", s)
		}
		return Ref{URL: u}, nil
	}
	rest := ""
	for _, p := range hubPrefixes {
		if strings.HasPrefix(s, p) {
			rest = s[len(p):]
		}
	}
	if rest == "" {
		return Ref{}, fmt.Errorf("%q is not a model reference: want hf.co/OWNER/REPO[:QUANT] or an https URL", s)
	}
	var r Ref
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		rest, r.Quant = rest[:i], rest[i+1:]
		if !validPart(r.Quant) {
			return Ref{}, fmt.Errorf("%q: quantization %q is not a name like Q4_K_M", s, r.Quant)
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 2 || !validPart(parts[0]) || !validPart(parts[1]) {
		return Ref{}, fmt.Errorf("%q: want hf.co/OWNER/REPO[:QUANT]", s)
	}
	r.Owner, r.Repo = parts[0], parts[1]
	return r, nil
}

// String gives the reference in its canonical hf.co spelling.
func (r Ref) String() string {
	if r.URL != nil {
		return r.URL.String()
	}
	s := "hf.co/" + r.Owner + "/" + r.Repo
	if r.Quant != "" {
		s += ":" + r.Quant
	}
	return s
}
