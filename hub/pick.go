package hub

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// File is one file of a hub repository.
type File struct {
	Path   string // inside the repository
	Size   int64
	SHA256 string // hex; empty when the hub gives none (a non-LFS file)
}

// defaultQuants is the order llama.cpp's -hf and ollama prefer when no
// quantization is asked for: a good size/quality balance first.
var defaultQuants = []string{"Q4_K_M", "Q4_0", "Q8_0"}

// split matches the shards of a model split by gguf-split; they are
// skipped because loading needs all shards, which Pagoda does not support.
var split = regexp.MustCompile(`-\d{5}-of-\d{5}\.gguf$`)

// quantName finds the quantization written in a GGUF file name, e.g.
// "Q4_K_M" in "Llama-3.2-1B-Instruct-Q4_K_M.gguf".
var quantName = regexp.MustCompile(`(?i)(?:^|[-._])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)(?:[-._]|$)`)

// QuantOf is the quantization in a file's name, upper-cased, or "".
func QuantOf(name string) string {
	m := quantName.FindAllStringSubmatch(strings.TrimSuffix(path.Base(name), path.Ext(name)), -1)
	if len(m) == 0 {
		return ""
	}
	// The last match: a quantization follows the model's own name.
	return strings.ToUpper(m[len(m)-1][1])
}

// candidates are the single-file GGUF models among files. Vision
// projectors (mmproj) are GGUF files too but not a model to run.
func candidates(files []File) []File {
	var out []File
	for _, f := range files {
		low := strings.ToLower(f.Path)
		if strings.HasSuffix(low, ".gguf") && !split.MatchString(low) && !strings.Contains(path.Base(low), "mmproj") {
			out = append(out, f)
		}
	}
	return out
}

// Pick chooses the GGUF file to download for quant ("" for the default
// preference). An exact quantization match beats a file whose name merely
// contains the text, so Q4_0 picks x-Q4_0.gguf even when x-Q4_0_4_4.gguf
// is listed first.
func Pick(files []File, quant string) (File, error) {
	c := candidates(files)
	if len(c) == 0 {
		if len(files) > 0 && anySplit(files) {
			return File{}, fmt.Errorf("the repository has only split GGUF files (-00001-of-N), which pagoda cannot load")
		}
		return File{}, fmt.Errorf("the repository has no .gguf file")
	}
	if quant == "" {
		for _, q := range defaultQuants {
			if f, ok := exact(c, q); ok {
				return f, nil
			}
		}
		return c[0], nil
	}
	if f, ok := exact(c, quant); ok {
		return f, nil
	}
	for _, f := range c {
		if strings.Contains(strings.ToLower(path.Base(f.Path)), strings.ToLower(quant)) {
			return f, nil
		}
	}
	return File{}, fmt.Errorf("no %s file in the repository; it has %s", quant, strings.Join(Quants(c), ", "))
}

func exact(c []File, quant string) (File, bool) {
	for _, f := range c {
		if strings.EqualFold(QuantOf(f.Path), quant) {
			return f, true
		}
	}
	return File{}, false
}

func anySplit(files []File) bool {
	for _, f := range files {
		if split.MatchString(strings.ToLower(f.Path)) {
			return true
		}
	}
	return false
}

// Quants lists the quantizations the candidate files offer, sorted; a file
// with none in its name is listed by name so the list is never empty.
func Quants(c []File) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range c {
		q := QuantOf(f.Path)
		if q == "" {
			q = path.Base(f.Path)
		}
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}
