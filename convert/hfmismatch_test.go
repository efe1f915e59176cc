package convert

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/hf/hftest"
	"pagoda/testutil"
)

// TestHFConfigMismatch (issue 24, item 5): an HF directory whose
// config.json does not match its tensors (hidden_size, num_hidden_layers
// up or down, intermediate_size, heads) is refused naming the setting and
// the tensor that contradicts it, and no GGUF is written (it used to
// convert with rc 0 into a file run could not load, or, with a layer
// fewer, one that ran a truncated model). The untouched directories
// convert.
func TestHFConfigMismatch(t *testing.T) {
	dir := t.TempDir()
	ck := hftest.Write(t, dir, hftest.Tiny, `{"quant_method":"gptq","bits":4,"group_size":32,"sym":true,"desc_act":false}`, false)
	stories := testutil.Shared(t, "models/derived/stories260K-hf")
	for _, src := range []string{ck.FloatDir, ck.QuantDir, stories} {
		cfg := map[string]any{}
		b, err := os.ReadFile(filepath.Join(src, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		good := filepath.Join(t.TempDir(), "good.gguf")
		if err := ToGGUF(src, good, ConvertOptions{Warn: func(string) {}}); err != nil {
			t.Fatalf("%s as written: %v", src, err)
		}
		hidden, layers := cfg["hidden_size"].(float64), cfg["num_hidden_layers"].(float64)
		for _, c := range []struct {
			key  string
			val  float64
			want string
		}{
			{"hidden_size", 2 * hidden, "hidden_size"},
			{"num_hidden_layers", layers - 1, "num_hidden_layers is " + itoa(int(layers)-1) + " but the checkpoint has layer " + itoa(int(layers)-1)},
			{"num_hidden_layers", layers + 1, "num_hidden_layers is " + itoa(int(layers)+1) + " but the checkpoint has no layer " + itoa(int(layers))},
			{"intermediate_size", cfg["intermediate_size"].(float64) + 32, "intermediate_size"},
			{"num_key_value_heads", cfg["num_key_value_heads"].(float64) * 2, "num_key_value_heads"},
		} {
			bad := filepath.Join(t.TempDir(), "hf")
			if err := os.MkdirAll(bad, 0o755); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(src)
			for _, e := range ents {
				if e.Name() != "config.json" {
					if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(bad, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			edited := map[string]any{}
			for k, v := range cfg {
				edited[k] = v
			}
			edited[c.key] = c.val
			b, _ := json.Marshal(edited)
			if err := os.WriteFile(filepath.Join(bad, "config.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out.gguf")
			err := ToGGUF(bad, out, ConvertOptions{Warn: func(string) {}})
			if err == nil || !strings.Contains(err.Error(), "config.json does not match the tensors") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s with %s %v: %v, want an error naming %q", filepath.Base(src), c.key, c.val, err, c.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s with %s %v: output written (%v)", filepath.Base(src), c.key, c.val, err)
			}
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
