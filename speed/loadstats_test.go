package speed

import (
	"runtime"
	"strings"
	"testing"
)

func TestReadMemory(t *testing.T) {
	m, ok := ReadMemory()
	if runtime.GOOS != "linux" {
		if ok {
			t.Errorf("ReadMemory ok on %s", runtime.GOOS)
		}
		return
	}
	if !ok || m.RSS <= 0 || m.Peak < m.RSS || m.Anon <= 0 || m.Anon+m.File > m.RSS+1<<20 {
		t.Fatalf("ReadMemory = %+v, %v", m, ok)
	}
	if s := m.String(); !strings.HasPrefix(s, "resident ") || !strings.Contains(s, "peak ") {
		t.Errorf("String() = %q", s)
	}
}
