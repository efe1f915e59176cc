package main

import (
	"strings"
	"testing"
)

// TestRunStreamingPastContext: with a streaming policy run keeps
// generating past --ctx, starting like the full cache (nothing has left
// the window yet); without it generation stops at the context; a bad
// policy is refused with the parser's error.
func TestRunStreamingPastContext(t *testing.T) {
	args := []string{"run", "-p", "Once upon a time", "-n", "400", "--temp", "0", "--ignore-eos", "--ctx", "64"}
	code, plain, errOut := pagoda(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	code, streamed, errOut := pagoda(t, append(args, "--kv-policy", "streaming:sinks=4,window=32")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(streamed, "Once upon a time, there was a little girl named Lily. She loved to play") {
		t.Errorf("streaming run starts %.80q", streamed)
	}
	// stories260K writes about 2 bytes a token: 64 tokens against 400.
	if len(streamed) < 4*len(plain) {
		t.Errorf("streaming wrote %d bytes, the context-bound run %d", len(streamed), len(plain))
	}
	code, _, errOut = pagoda(t, append(args, "--kv-policy", "streaming:window=0")...)
	if code != 1 || !strings.Contains(errOut, "--kv-policy") || !strings.Contains(errOut, "window 0") {
		t.Errorf("bad policy: exit %d, %q", code, errOut)
	}
}
