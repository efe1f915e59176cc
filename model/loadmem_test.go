package model

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"pagoda/quant"
	"pagoda/synth"
)

// procStatus reads the kB fields of /proc/self/status, in bytes.
func procStatus(t *testing.T) map[string]int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		fs := strings.Fields(v)
		if !ok || len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err == nil {
			out[k] = n << 10
		}
	}
	return out
}

type loadMem struct {
	Base, Peak, Steady, Anon, File int64
}

const loadMemEnv = "PAGODA_TEST_LOADMEM"

// TestLoadMemChild is the child process of TestLoadMemory: it loads the
// model named in the environment and prints its resident memory.
func TestLoadMemChild(t *testing.T) {
	path := os.Getenv(loadMemEnv)
	if path == "" {
		t.Skip("run by TestLoadMemory")
	}
	runtime.GC()
	debug.FreeOSMemory()
	before := procStatus(t)
	m, err := Open(path, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	after := procStatus(t)
	r := loadMem{Base: before["VmRSS"], Peak: after["VmHWM"], Steady: after["VmRSS"], Anon: after["RssAnon"], File: after["RssFile"]}
	b, _ := json.Marshal(r)
	os.Stdout.Write(append(append([]byte("LOADMEM "), b...), '\n'))
	runtime.KeepAlive(m)
	m.Close()
}

// TestLoadMemory: loading a GGUF model holds at most 1.1× the file (plus a
// little for the runtime, the pool and the tokenizer) in resident memory,
// at its peak and after: each tensor's file pages are let go once it is
// repacked, so the file and its repacked copy are never resident together.
// It runs in a fresh process, whose high-water mark is its own.
func TestLoadMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/status and relies on madvise")
	}
	if testing.Short() {
		t.Skip("writes and loads a 60 MB model")
	}
	// Two TinyLlama-1.1B layers: matrices of 0.6 to 6.5 MB packed, so both
	// the heap and the mapped allocations are exercised.
	s, err := synth.Preset("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	s.Layers, s.Vocab = 2, 4096
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q8_0} {
		t.Run(typ.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := synth.Write(path, synth.Options{Shape: s, Type: typ, OutputType: quant.Q6_K, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestLoadMemChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), loadMemEnv+"="+path)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var r loadMem
			i := strings.Index(string(out), "LOADMEM ")
			if i < 0 {
				t.Fatalf("child printed no measurement:\n%s", out)
			}
			line, _, _ := strings.Cut(string(out[i+len("LOADMEM "):]), "\n")
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			const mib = 1 << 20
			size := st.Size()
			limit := size*11/10 + 12*mib
			t.Logf("file %.1f MiB: resident before %.1f, peak %.1f (+%.1f), after %.1f (+%.1f; anon %.1f, file %.1f) MiB; limit +%.1f",
				float64(size)/mib, float64(r.Base)/mib, float64(r.Peak)/mib, float64(r.Peak-r.Base)/mib,
				float64(r.Steady)/mib, float64(r.Steady-r.Base)/mib, float64(r.Anon)/mib, float64(r.File)/mib, float64(limit)/mib)
			if r.Peak-r.Base > limit {
				t.Errorf("peak resident memory grew %.1f MiB loading a %.1f MiB file, over %.1f", float64(r.Peak-r.Base)/mib, float64(size)/mib, float64(limit)/mib)
			}
			if r.Steady-r.Base > limit {
				t.Errorf("resident memory after load grew %.1f MiB, over %.1f", float64(r.Steady-r.Base)/mib, float64(limit)/mib)
			}
		})
	}
}
