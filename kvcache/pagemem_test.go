package kvcache

import (
	"errors"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"pagoda/model"
)

// heapNow collects and reads the live heap and the collector's goal.
func heapNow() (live, goal uint64) {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// rssBytes is the process's resident memory (VmRSS), or -1 where
// /proc/self/status does not tell it.
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

const mib = 1 << 20

// offHeapCache reserves 1 GiB of f32 pages (one layer, 8 KV heads of
// 128: 128 KiB a block of 16 tokens).
func offHeapCache(t *testing.T) *Cache {
	t.Helper()
	c, err := New(Config{NLayer: 1, NKVHead: 8, HeadDim: 128, BlockSize: 16, NumBlocks: 8192, DType: F32})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MappedBytes(); got != 8192*128<<10 {
		t.Fatalf("mapped %d bytes, want %d", got, 8192*128<<10)
	}
	return c
}

// fillBlocks writes every row of the first n blocks (sequence 0).
func fillBlocks(t *testing.T, c *Cache, n int) {
	t.Helper()
	if !c.Allocate(0, nil, 0, n*16) {
		t.Fatal("allocate")
	}
	k := make([]float32, 8*128)
	for i := range k {
		k[i] = float32(i%13) - 6
	}
	for pos := int32(0); pos < int32(n*16); pos++ {
		storeTok(c, 0, 0, pos, k, k)
	}
}

// TestPagesOffHeap: a 1 GiB pool adds nothing to the live heap or the
// collector's goal (on the heap it added the whole GiB to both, and the
// goal doubled it), and its pages become resident only as they are
// written.
func TestPagesOffHeap(t *testing.T) {
	live0, goal0 := heapNow()
	rss0 := rssBytes()
	c := offHeapCache(t)
	live1, goal1 := heapNow()
	rss1 := rssBytes()
	fillBlocks(t, c, 256) // 32 MiB of K and V written
	rss2 := rssBytes()
	live2, goal2 := heapNow()
	t.Logf("live heap %d → %d → %d MiB, goal %d → %d → %d MiB, RSS %d → %d → %d MiB",
		live0/mib, live1/mib, live2/mib, goal0/mib, goal1/mib, goal2/mib, rss0/mib, rss1/mib, rss2/mib)
	if live2 > live0+8*mib || goal2 > goal0+16*mib {
		t.Errorf("the heap holds the pool: live %d → %d bytes, goal %d → %d", live0, live2, goal0, goal2)
	}
	if rss0 >= 0 {
		if rss1-rss0 > 16*mib {
			t.Errorf("reserving 1 GiB made %d MiB resident", (rss1-rss0)/mib)
		}
		if d := rss2 - rss1; d < 28*mib || d > 48*mib {
			t.Errorf("writing 32 MiB of pages made %d MiB resident", d/mib)
		}
	}
	var a [4]float32
	out := make([]float32, 32*128)
	attendTok(c, 0, 0, 256*16, make([]float32, 32*128), out, benchAttn32())
	copy(a[:], out)
	if a != [4]float32{-6, -5, -4, -3} {
		t.Errorf("attention over the written pages reads %v, want the stored row's first values", a)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if rss3 := rssBytes(); rss0 >= 0 && rss2-rss3 < 28*mib {
		t.Errorf("Close left RSS at %d MiB (%d before it)", rss3/mib, rss2/mib)
	}
}

// benchAttn32 is 32 query heads over the test pool's 8 KV heads of 128.
func benchAttn32() model.AttnParams {
	return model.AttnParams{NHead: 32, NKVHead: 8, HeadDim: 128, Scale: 0.088}
}

// TestClosedStorage: after Close nothing reaches the unmapped pages: a
// step, an export and an import fail with ErrClosed, and Close again is
// a no-op.
func TestClosedStorage(t *testing.T) {
	c, err := New(Config{NLayer: 2, NKVHead: 1, HeadDim: 32, BlockSize: 32, NumBlocks: 8, KFormat: Q8_0, VFormat: DefaultKIVI(4)})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Allocate(0, nil, 0, 40) {
		t.Fatal("allocate")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if c.MappedBytes() != 0 {
		t.Errorf("closed storage still maps %d bytes", c.MappedBytes())
	}
	if err := c.Begin(&model.Batch{Tokens: []int32{0}, Pos: []int32{0}, Seq: []int32{0}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Begin after Close: %v", err)
	}
	if _, err := c.ExportPages(nil, []int32{0}); !errors.Is(err, ErrClosed) {
		t.Errorf("ExportPages after Close: %v", err)
	}
	if err := c.ImportPages([]int32{0}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("ImportPages after Close: %v", err)
	}
	// The manager's side (no pages) keeps working: freeing returns blocks.
	c.Free(0)
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestDroppedStorageReleased: a cache dropped without Close gives its
// pages back once the collector finds it unreachable.
func TestDroppedStorageReleased(t *testing.T) {
	if rssBytes() < 0 {
		t.Skip("no /proc/self/status")
	}
	c := offHeapCache(t)
	fillBlocks(t, c, 256)
	before := rssBytes()
	c = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		if after := rssBytes(); before-after >= 28*mib {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("RSS %d MiB → %d MiB after dropping a cache with 32 MiB of written pages", before/mib, after/mib)
		}
	}
}
