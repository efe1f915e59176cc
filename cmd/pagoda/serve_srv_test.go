package main

import (
	"os"
	"syscall"
	"testing"
	"time"
)

func TestServedName(t *testing.T) {
	for path, want := range map[string]string{
		"/m/stories260K.gguf": "stories260K", "/m/stories15M.bin": "stories15M",
		"/m/Llama-3.2-1B/": "Llama-3.2-1B", "model.safetensors": "model.safetensors", "/m/.bin": ".bin",
	} {
		if got := servedName(path); got != want {
			t.Errorf("servedName(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestSecondSignalAborts checks that the first SIGTERM starts the drain
// and a second one aborts it.
func TestSecondSignalAborts(t *testing.T) {
	aborted := make(chan struct{})
	ctx, hard, stop := drainSignals(func() { close(aborted) })
	defer stop()
	wait := func(c <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not happen", what)
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wait(ctx.Done(), "drain on the first signal")
	if hard.Err() != nil {
		t.Fatal("the first signal aborted the drain")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wait(aborted, "abort on the second signal")
	wait(hard.Done(), "hard stop on the second signal")
}
