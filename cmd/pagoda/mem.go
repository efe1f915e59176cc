package main

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// memInfo is what /proc/meminfo says, in bytes (0 = not given).
type memInfo struct{ available, total int64 }

// parseMeminfo reads MemAvailable and MemTotal from /proc/meminfo text.
func parseMeminfo(r io.Reader) memInfo {
	var m memInfo
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil || kb < 0 || kb > 1<<53 {
			continue
		}
		switch key {
		case "MemAvailable":
			m.available = kb << 10
		case "MemTotal":
			m.total = kb << 10
		}
	}
	return m
}

// cgroupRoom is what a cgroup v2 memory limit leaves: memory.max minus
// memory.current, read from dir. 0 when there is no limit ("max") or no
// cgroup files, as on other systems.
func cgroupRoom(dir string) int64 {
	b, err := os.ReadFile(dir + "/memory.max")
	if err != nil {
		return 0
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || limit <= 0 {
		return 0
	}
	if b, err := os.ReadFile(dir + "/memory.current"); err == nil {
		if used, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && used > 0 {
			return max(limit-used, 1)
		}
	}
	return limit
}

// availableMemory is the bytes this process can still allocate: the
// machine's MemAvailable (MemTotal when the kernel lacks it), lowered to
// what a cgroup limit leaves. 0 means unknown (not Linux): callers then
// skip the check rather than guess.
func availableMemory(meminfoPath, cgroupDir string) int64 {
	var avail int64
	if f, err := os.Open(meminfoPath); err == nil {
		m := parseMeminfo(f)
		f.Close()
		avail = m.available
		if avail == 0 {
			avail = m.total
		}
	}
	if room := cgroupRoom(cgroupDir); room > 0 && (avail == 0 || room < avail) {
		avail = room
	}
	return avail
}

// systemMemory is availableMemory of this machine.
func systemMemory() int64 { return availableMemory("/proc/meminfo", "/sys/fs/cgroup") }
