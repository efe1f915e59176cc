package embedded

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"pagoda/gguf"
)

func TestPathWritesOnceAndRepairs(t *testing.T) {
	dir := t.TempDir()
	p, err := Path(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, Bytes()) {
		t.Fatalf("%s does not hold the embedded model (%v)", p, err)
	}
	st, _ := os.Stat(p)
	if p2, err := Path(dir); err != nil || p2 != p {
		t.Fatalf("second Path: %q, %v; want %q", p2, err, p)
	}
	if st2, _ := os.Stat(p); !st2.ModTime().Equal(st.ModTime()) {
		t.Error("an intact file was rewritten")
	}
	// A truncated file (an interrupted earlier write) is replaced.
	if err := os.WriteFile(p, Bytes()[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Path(dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, Bytes()) {
		t.Fatal("a truncated file was not replaced")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

func TestIsTheTrainedModel(t *testing.T) {
	f, err := gguf.Open(writeTemp(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if arch, _ := f.String("general.architecture"); arch != "llama" {
		t.Fatalf("architecture %q", arch)
	}
	if n, _ := f.Uint("llama.block_count"); n != 5 {
		t.Fatalf("block count %d, want stories260K's 5", n)
	}
}

func writeTemp(t *testing.T) string {
	p, err := Path(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
