package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fakeMeminfo = `MemTotal:       24683548 kB
MemFree:         1000000 kB
MemAvailable:   20000000 kB
Buffers:          123456 kB
`

func TestParseMeminfo(t *testing.T) {
	m := parseMeminfo(strings.NewReader(fakeMeminfo))
	if m.available != 20000000<<10 || m.total != 24683548<<10 {
		t.Fatalf("%+v", m)
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAvailableMemory(t *testing.T) {
	dir := t.TempDir()
	mi := writeFile(t, dir, "meminfo", fakeMeminfo)
	cg := t.TempDir()
	if got := availableMemory(mi, cg); got != 20000000<<10 {
		t.Errorf("no cgroup: %d", got)
	}
	// A cgroup limit under MemAvailable wins, less what the group uses.
	writeFile(t, cg, "memory.max", "4294967296\n")
	writeFile(t, cg, "memory.current", "1073741824\n")
	if got := availableMemory(mi, cg); got != 3<<30 {
		t.Errorf("cgroup: %d", got)
	}
	writeFile(t, cg, "memory.max", "max\n")
	if got := availableMemory(mi, cg); got != 20000000<<10 {
		t.Errorf("cgroup without limit: %d", got)
	}
	// Without MemAvailable (old kernels) MemTotal stands in.
	old := writeFile(t, dir, "meminfo.old", "MemTotal: 1000 kB\n")
	if got := availableMemory(old, cg); got != 1000<<10 {
		t.Errorf("old kernel: %d", got)
	}
	if got := availableMemory(filepath.Join(dir, "none"), filepath.Join(dir, "none")); got != 0 {
		t.Errorf("no information: %d, want 0", got)
	}
}

func TestCheckBudget(t *testing.T) {
	if err := checkBudget(200<<30, 23<<30); err == nil || !strings.Contains(err.Error(), "memory available") {
		t.Errorf("200 GiB of 23: %v", err)
	}
	if err := checkBudget(2<<30, 23<<30); err != nil {
		t.Errorf("2 GiB of 23: %v", err)
	}
	if err := checkBudget(100<<40, 0); err != nil {
		t.Errorf("unknown memory must not refuse: %v", err)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "2GB": 2e9, "1.5GiB": 3 << 29, "100": 100} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"NaN", "nanGiB", "-1GiB", "Inf", "2PiB", "lots"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}
