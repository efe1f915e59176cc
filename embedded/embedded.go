// Package embedded carries the model that ships inside the binary: the
// trained stories260K (about 1 MB, MIT-licensed, see LICENSE-stories260K),
// so `pagoda run` tells a small coherent story on a machine with nothing
// downloaded.
package embedded

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

//go:embed stories260K.gguf
var stories260K []byte

// ChatTemplate is the chat template shipped with the built-in model,
// which has none of its own: it frames a chat as a dialogue in a story,
// and ChatStops end the model's turn.
//
//go:embed chat_template.jinja
var ChatTemplate string

// ChatStops end an assistant turn under ChatTemplate: the closing quote.
func ChatStops() []string { return []string{"\""} }

// Name is the default model's name, as the CLI reports it.
const Name = "stories260K"

// Bytes is the default model's GGUF file.
func Bytes() []byte { return stories260K }

// Path returns a file holding the default model, writing it into dir (the
// user's cache folder when dir is empty) the first time: the loaders map
// files, so the bytes need a path. A file there that differs (a truncated
// earlier write, another version) is replaced.
func Path(dir string) (string, error) {
	if dir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			d = os.TempDir()
		}
		dir = filepath.Join(d, "pagoda")
	}
	sum := sha256.Sum256(stories260K)
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", Name, hex.EncodeToString(sum[:4])))
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, stories260K) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("embedded: %w", err)
	}
	tmp, err := os.CreateTemp(dir, Name+"-*.tmp")
	if err != nil {
		return "", fmt.Errorf("embedded: %w", err)
	}
	_, werr := tmp.Write(stories260K)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("embedded: writing %s: %w", tmp.Name(), errors.Join(werr, cerr))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("embedded: %w", err)
	}
	return path, nil
}
