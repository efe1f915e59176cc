package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Cache is the folder pulled models live in. A hub file is kept at
// hf.co/OWNER/REPO/PATH and a URL's at HOST/PATH, so the cached name says
// where the file came from and a cached hub file is found without asking
// the hub again.
type Cache struct{ Dir string }

// partialSuffix marks a download in progress; it is never a cached model.
const partialSuffix = ".partial"

// DefaultCache is $PAGODA_MODELS, or pagoda/models in the user's cache
// folder.
func DefaultCache() (Cache, error) {
	if d := os.Getenv("PAGODA_MODELS"); d != "" {
		return Cache{d}, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return Cache{}, fmt.Errorf("no model cache folder (set PAGODA_MODELS): %w", err)
	}
	return Cache{filepath.Join(d, "pagoda", "models")}, nil
}

// repoDir is where a hub repository's files are kept.
func (c Cache) repoDir(r Ref) string {
	return filepath.Join(c.Dir, "hf.co", r.Owner, r.Repo)
}

// cleanRel checks that a remote path stays inside its folder once joined:
// the hub and URLs are not trusted to name files on this machine.
func cleanRel(p string) (string, error) {
	p = strings.TrimPrefix(p, "/")
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." || strings.ContainsRune(part, '\\') {
			return "", fmt.Errorf("unsafe file path %q", p)
		}
	}
	return filepath.FromSlash(p), nil
}

// destFor is where ref's file f (or a URL's file) is stored.
func (c Cache) destFor(r Ref, f File) (string, error) {
	if r.URL != nil {
		rel, err := cleanRel(r.URL.Host + "/" + strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/"))
		if err != nil {
			return "", err
		}
		return filepath.Join(c.Dir, rel), nil
	}
	rel, err := cleanRel(f.Path)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.repoDir(r), rel), nil
}

// Lookup finds ref's file in the cache without the network, choosing among
// a repository's cached files as Pick would among the hub's.
func (c Cache) Lookup(r Ref) (string, bool) {
	if r.URL != nil {
		p, err := c.destFor(r, File{})
		if err != nil {
			return "", false
		}
		st, err := os.Stat(p)
		return p, err == nil && st.Mode().IsRegular()
	}
	f, err := Pick(c.repoFiles(r), r.Quant)
	if err != nil {
		return "", false
	}
	return filepath.Join(c.repoDir(r), filepath.FromSlash(f.Path)), true
}

// repoFiles are the files cached for a hub repository, partial ones
// included (Pick ignores them: they do not end in .gguf).
func (c Cache) repoFiles(r Ref) []File {
	dir := c.repoDir(r)
	var files []File
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, File{Path: filepath.ToSlash(rel)})
		}
		return nil
	})
	return files
}

// Entry is one cached model.
type Entry struct {
	// Name is the reference pull took (hf.co/OWNER/REPO:QUANT, or the
	// URL) when that reference finds this file again; otherwise File.
	Name string
	File string // the path under the cache folder, with '/' separators
	Size int64
	Path string
}

// List returns the cached models, sorted by name. Partial downloads are
// not models and are left out; a missing cache is an empty one.
func (c Cache) List() ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(c.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == c.Dir {
				return fs.SkipAll
			}
			return err
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(strings.ToLower(p), ".gguf") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(c.Dir, p)
		rel = filepath.ToSlash(rel)
		out = append(out, Entry{Name: c.refName(rel, p), File: rel, Size: info.Size(), Path: p})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// refName is the reference that pulls the cached file rel (at p) and
// finds it again: hf.co/OWNER/REPO:QUANT for a hub file (the QUANT its
// name carries, as Pick matches it), https://HOST/PATH for a URL's.
// Without one that finds p it is rel.
func (c Cache) refName(rel, p string) string {
	parts := strings.Split(rel, "/")
	name := "https://" + rel
	if len(parts) >= 4 && parts[0] == "hf.co" {
		name = "hf.co/" + parts[1] + "/" + parts[2]
		if q := QuantOf(parts[len(parts)-1]); q != "" {
			name += ":" + q
		}
	}
	if r, err := ParseRef(name); err == nil {
		if got, ok := c.Lookup(r); ok && got == p {
			return name
		}
	}
	return rel
}

// Remove deletes one cached model, named as List names it or by the
// reference that pulled it, and any partial download of it. It returns the
// path removed. Folders it leaves empty go too, so List stays tidy.
func (c Cache) Remove(name string) (string, error) {
	p, err := c.find(name)
	if err != nil {
		return "", err
	}
	if err := os.Remove(p); err != nil {
		return "", err
	}
	os.Remove(p + partialSuffix)
	for d := filepath.Dir(p); d != filepath.Clean(c.Dir) && strings.HasPrefix(d, filepath.Clean(c.Dir)); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break // not empty
		}
	}
	return p, nil
}

func (c Cache) find(name string) (string, error) {
	if r, err := ParseRef(name); err == nil {
		if r.URL == nil && r.Quant == "" {
			// Without a quantization the reference may fit several cached
			// files; deleting the one run would pick is a guess too far.
			if c := candidates(c.repoFiles(r)); len(c) > 1 {
				return "", fmt.Errorf("%s has %d cached files (%s): name one, e.g. %s:%s", name, len(c), strings.Join(Quants(c), ", "), name, Quants(c)[0])
			}
		}
		if p, ok := c.Lookup(r); ok {
			return p, nil
		}
		return "", fmt.Errorf("%s is not in the cache %s (see pagoda list)", name, c.Dir)
	}
	rel, err := cleanRel(name)
	if err != nil {
		return "", err
	}
	p := filepath.Join(c.Dir, rel)
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || !strings.HasSuffix(strings.ToLower(p), ".gguf") {
		return "", fmt.Errorf("%s is not a model in the cache %s (see pagoda list)", name, c.Dir)
	}
	return p, nil
}
