package engine

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"pagoda/kvcache"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

// hashChildEnv makes the test binary, run again as a child, print the
// block hashes of TestBlockHashesAcrossProcesses's workload and stop.
const hashChildEnv = "PAGODA_TEST_BLOCK_HASHES_CHILD"

// storiesBlockHashes runs greedy requests for one prompt on stories260K,
// plain, salted and under a streaming policy whose window ends inside the
// prompt, and returns each one's stored block hashes in order, read from
// the engine's KV events.
func storiesBlockHashes(t *testing.T) map[string][]uint64 {
	m := openStories(t)
	tok := m.Tokenizer()
	log := kvcache.NewEventLog(1024)
	cfg := modelConfig(m)
	cfg.KVEvents = log
	e, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	defer e.Stop(context.Background())
	prompt := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree.", tokenizer.Options{AddSpecial: true})
	if len(prompt) < 3*kvcache.DefaultBlockSize {
		t.Fatalf("prompt of %d tokens is too short", len(prompt))
	}
	const stream = "streaming:sinks=4,window=24"
	out := map[string][]uint64{}
	for _, c := range []struct {
		name string
		r    Request
	}{
		{"plain", Request{}},
		{"salted", Request{CacheSalt: "tenant-a"}},
		{"streaming", Request{KVPolicy: stream}},
	} {
		from := log.Next()
		r := c.r
		r.Prompt, r.MaxTokens, r.IgnoreEOS = prompt, 24, true
		run(t, e, &r)
		// Blocks is answered between steps, after the flush of the step
		// that finished the request.
		if _, err := e.Blocks(context.Background()); err != nil {
			t.Fatal(err)
		}
		for from < log.Next() {
			batches, _ := log.Read(from, nil)
			for _, b := range batches {
				for _, ev := range b.Events {
					if ev.Kind == kvcache.BlockStored {
						out[c.name] = append(out[c.name], ev.Hash)
					}
				}
				from = b.Seq + 1
			}
		}
	}
	return out
}

// TestBlockHashesAcrossProcesses: the same prompt gives the same block
// hashes in two fresh processes (this one and the test binary run again),
// for plain, salted and streaming requests; and within one process the
// salt and the streaming policy's namespace keep their blocks apart from
// the plain ones (the streaming request shares only the blocks it computed
// over the full history).
func TestBlockHashesAcrossProcesses(t *testing.T) {
	if os.Getenv(hashChildEnv) == "1" {
		for name, hs := range storiesBlockHashes(t) {
			fmt.Printf("HASHES %s %x\n", name, hs)
		}
		return
	}
	testutil.Shared(t, "models/gguf/stories260K.gguf") // skips without the shared files
	cmd := exec.Command(os.Args[0], "-test.run=^TestBlockHashesAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), hashChildEnv+"=1")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	child := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "HASHES" {
			child[f[1]] = strings.Join(f[2:], " ")
		}
	}
	mine := storiesBlockHashes(t)
	for _, name := range []string{"plain", "salted", "streaming"} {
		hs := mine[name]
		if len(hs) < 3 {
			t.Fatalf("%s: only %d blocks stored", name, len(hs))
		}
		if got := fmt.Sprintf("%x", hs); child[name] != got {
			t.Fatalf("%s: block hashes differ between processes:\nparent %s\nchild  %s", name, got, child[name])
		}
	}
	// The salted request shares nothing with the plain one: every block
	// was stored again, under other hashes.
	for _, h := range mine["salted"] {
		if slices.Contains(mine["plain"], h) {
			t.Fatalf("salted block %x also stored by the plain request", h)
		}
	}
	// The streaming request hit the plain one's exact blocks (sinks 4 +
	// window 24 = 28 tokens: block 0 of 16), so it stored only the later
	// ones, in its own namespace.
	for _, h := range mine["streaming"] {
		if slices.Contains(mine["plain"], h) || slices.Contains(mine["salted"], h) {
			t.Fatalf("streaming block %x shares a hash with a plain or salted one", h)
		}
	}
	if n, want := len(mine["streaming"]), len(mine["plain"])-1; n != want {
		t.Fatalf("streaming request stored %d blocks, want %d (all but the exact first)", n, want)
	}
}
