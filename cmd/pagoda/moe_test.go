package main

import (
	"strings"
	"testing"

	"pagoda/testutil"
)

// inspect and kv-size report MLA's latent cache (3 layers × (64 + 16)
// values) beside its multi-head equivalent (4 heads × (48 + 32) per
// layer), and the experts.
func TestMLAReports(t *testing.T) {
	path := testutil.Shared(t, "golden/models/g-deepseek2.Q8_0.gguf")
	code, stdout, stderr := pagoda(t, "inspect", path)
	for _, want := range []string{"MLA: q_lora 96, kv_lora 64, qk 32+16, v 32; cache row 80",
		"experts       8, 2 used per token, width 32; softmax gating, renormalised, ×2.5; shared width 32",
		"feed-forward  128 dense (first 1 layers)",
		"KV per token  480 bytes f16, 960 bytes f32", "MHA equivalent 1920 bytes f16 (4.0× more)"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("inspect: exit %d, no %q in\n%s%s", code, want, stdout, stderr)
		}
	}
	code, stdout, stderr = pagoda(t, "kv-size", "-m", path, "-dtype", "f32", "-batch", "2", "-len", "100")
	for _, want := range []string{"bytes per token  960 ", "total            215040 bytes", "MHA equivalent   3840 bytes per token (K 48 + V 32 per head)"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("kv-size: exit %d, no %q in\n%s%s", code, want, stdout, stderr)
		}
	}
}
