package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	"pagoda/convert"
	"pagoda/gguf"
	"pagoda/model"
	"pagoda/quant"
	"pagoda/server"
)

func init() {
	register("version", "print Pagoda's version and the commit it was built from", func(args []string) error {
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("version takes no arguments")
		}
		fmt.Println("pagoda " + versionLine())
		return nil
	})
}

// version is the module version, or for a build from a checkout the
// commit (with "+dirty" for uncommitted changes), as runtime/debug reads
// them from the binary.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	v := bi.Main.Version
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if v == "" || v == "(devel)" {
		v = "dev"
	}
	if rev != "" && !strings.Contains(v, rev[:min(12, len(rev))]) {
		v += "+" + rev[:min(12, len(rev))]
		if dirty {
			v += ".dirty"
		}
	}
	return v
}

func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	var rev, at string
	dirty := false
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	line := version()
	switch {
	case rev != "":
		line += fmt.Sprintf(" (commit %s", rev)
		if dirty {
			line += ", modified"
		}
		if at != "" {
			line += ", " + at
		}
		line += ")"
	default:
		line += " (no VCS information: built with go run or -buildvcs=false)"
	}
	return line + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// modelInfo describes the loaded model for the ollama endpoints.
func modelInfo(m *model.Model, path string, kvBytes int64) server.ModelInfo {
	c := m.Config
	mi := server.ModelInfo{Family: c.Arch, Params: c.Params(), KVBytes: kvBytes, EmbeddingLen: c.NEmbd,
		Layers: c.NLayer, Heads: c.NHead, KVHead: c.NKVHead}
	switch ext := strings.ToLower(filepath.Ext(path)); {
	case ext == ".gguf":
		mi.Format = "gguf"
		mi.Quantization = ggufQuantization(path)
	case ext == ".bin":
		mi.Format, mi.Quantization = "llama2c", "F32"
	default:
		mi.Format = "safetensors"
	}
	if st, err := os.Stat(path); err == nil {
		if st.IsDir() {
			ents, _ := os.ReadDir(path)
			for _, e := range ents {
				if info, err := e.Info(); err == nil && !e.IsDir() {
					mi.SizeBytes += info.Size()
				}
			}
		} else {
			mi.SizeBytes = st.Size()
		}
	}
	return mi
}

// ggufQuantization names a GGUF's weight format as ollama's
// quantization_level does: general.file_type's llama-quantize name, else
// (files that do not record it, as the built-in model) the type holding
// most of the matrices' bytes.
func ggufQuantization(path string) string {
	f, err := gguf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if id, ok := f.Uint("general.file_type"); ok && id <= 1<<16 {
		if name := convert.FileTypeName(uint32(id)); name != "" {
			return name
		}
	}
	bytes := map[quant.Type]int{}
	for _, t := range f.Tensors {
		if len(t.Dims) >= 2 && t.Dims[1] > 1 {
			bytes[t.Type] += t.Size
		}
	}
	best, most := "", 0
	for t, n := range bytes {
		if n > most || n == most && t.String() < best {
			best, most = t.String(), n
		}
	}
	return best
}
