package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// IndexName is the file that maps tensor names to shards.
const IndexName = "model.safetensors.index.json"

// SingleName is the file of an unsharded checkpoint.
const SingleName = "model.safetensors"

// Set is the tensors of one checkpoint, possibly spread over shards.
type Set struct {
	Files []*File
	// Metadata of the first file (shards normally repeat it).
	Metadata map[string]string
	index    map[string]*Tensor
}

type indexFile struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// OpenDir opens the checkpoint in dir: the shards listed by
// model.safetensors.index.json, or model.safetensors. dir may also name a
// single .safetensors file.
func OpenDir(dir string) (*Set, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if st.Mode().IsRegular() {
		return openFiles([]string{dir})
	}
	idxPath := filepath.Join(dir, IndexName)
	raw, err := os.ReadFile(idxPath)
	if errors.Is(err, fs.ErrNotExist) {
		single := filepath.Join(dir, SingleName)
		if _, err := os.Stat(single); err != nil {
			return nil, fmt.Errorf("safetensors: %s: neither %s nor %s found", dir, IndexName, SingleName)
		}
		return openFiles([]string{single})
	}
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	var idx indexFile
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", idxPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: empty weight_map", idxPath)
	}
	var shards []string
	seen := map[string]bool{}
	names := make([]string, 0, len(idx.WeightMap))
	for name := range idx.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		// Shards must sit beside the index: no paths, no escaping the folder.
		if shard == "" || shard != filepath.Base(shard) || shard == "." || shard == ".." {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: shard name %q is not a plain file name", idxPath, name, shard)
		}
		if !seen[shard] {
			seen[shard] = true
			shards = append(shards, shard)
		}
	}
	sort.Strings(shards)
	paths := make([]string, len(shards))
	for i, s := range shards {
		paths[i] = filepath.Join(dir, s)
	}
	s, err := openFiles(paths)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		t, ok := s.index[name]
		want := filepath.Join(dir, idx.WeightMap[name])
		if !ok {
			s.Close()
			return nil, fmt.Errorf("safetensors: %s: tensor %q is not in %s", idxPath, name, idx.WeightMap[name])
		}
		if owner := s.owner(t); owner != want {
			s.Close()
			return nil, fmt.Errorf("safetensors: %s: tensor %q is listed in %s but found in %s", idxPath, name, idx.WeightMap[name], filepath.Base(owner))
		}
	}
	return s, nil
}

func (s *Set) owner(t *Tensor) string {
	for _, f := range s.Files {
		if ft, ok := f.index[t.Name]; ok && ft == t {
			return f.Path
		}
	}
	return ""
}

func openFiles(paths []string) (*Set, error) {
	s := &Set{index: map[string]*Tensor{}}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.Files = append(s.Files, f)
		if s.Metadata == nil {
			s.Metadata = f.Metadata
		}
		for _, t := range f.Tensors {
			if _, dup := s.index[t.Name]; dup {
				s.Close()
				return nil, fmt.Errorf("safetensors: %s: tensor %q also appears in another shard", p, t.Name)
			}
			s.index[t.Name] = t
		}
	}
	return s, nil
}

// Tensor returns the named tensor.
func (s *Set) Tensor(name string) (*Tensor, bool) {
	t, ok := s.index[name]
	return t, ok
}

// Names returns every tensor name, sorted.
func (s *Set) Names() []string {
	out := make([]string, 0, len(s.index))
	for n := range s.index {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close releases every shard's mapping.
func (s *Set) Close() error {
	var first error
	for _, f := range s.Files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
