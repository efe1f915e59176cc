package speed

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory is the process's resident memory, from /proc/self/status: RSS
// (VmRSS) and its peak so far (VmHWM), split into anonymous memory (the
// repacked weights, the KV cache, the heap) and file-backed pages (the
// model file's mapping, which the page cache can drop and reload).
type Memory struct {
	RSS, Peak, Anon, File int64
}

// ReadMemory reads the process's resident memory; ok is false where
// /proc/self/status is not there (anything but Linux).
func ReadMemory() (m Memory, ok bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return Memory{}, false
	}
	defer f.Close()
	fields := map[string]*int64{"VmRSS": &m.RSS, "VmHWM": &m.Peak, "RssAnon": &m.Anon, "RssFile": &m.File}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		dst := fields[k]
		fs := strings.Fields(v)
		if dst == nil || len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(fs[0], 10, 64); err == nil {
			*dst = n << 10
			ok = true
		}
	}
	return m, ok
}

// String is the load-stats summary: "resident 575 MiB (peak 609 MiB;
// anon 562 MiB, file 12 MiB)".
func (m Memory) String() string {
	mib := func(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
	return fmt.Sprintf("resident %s (peak %s; anon %s, file %s)", mib(m.RSS), mib(m.Peak), mib(m.Anon), mib(m.File))
}
