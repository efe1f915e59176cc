package kvcache

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"

	"pagoda/mmapfile"
)

// PageMem is where a storage's pages live: anonymous mappings outside the
// Go heap. The KV pool is most of a server's memory and is allocated once;
// on the heap the collector's goal would be about twice it, so garbage
// could pile up to the size of the pool before a collection, and the
// pool would be scanned for nothing. Mapped, the collector sees only the
// live heap, and the kernel commits a page when it is first written, so
// resident memory follows the blocks used, not the budget reserved.
//
// The arrays hold numbers only (no Go pointers may live there). A nil
// *PageMem allocates on the heap: formats' pages made on their own, in
// tests.
type PageMem struct {
	mu     sync.Mutex
	unmaps []func() error
	bytes  int64
	err    error // the first failed mapping
}

// Word is what page arrays may hold: plain numbers, which the collector
// need not see.
type Word interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~int32 | ~uint32 | ~float32
}

// PageArray returns n zero elements from m (from the heap when m is nil):
// Format.NewPages makes its arrays with it.
// A mapping that fails is recorded in m.err and yields nil; the storage
// checks m.err once its pages are made.
func PageArray[T Word](m *PageMem, n int) []T {
	if m == nil || n == 0 {
		return make([]T, n)
	}
	var z T
	b := m.raw(n * int(unsafe.Sizeof(z)))
	if b == nil {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func (m *PageMem) raw(size int) []byte {
	b, unmap, err := mmapfile.Anon(size)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.err == nil {
			m.err = err
		}
		return nil
	}
	m.unmaps = append(m.unmaps, unmap)
	m.bytes += int64(size)
	return b
}

// Err is the first mapping that failed, if any.
func (m *PageMem) Err() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Mapped is the address space mapped so far.
func (m *PageMem) Mapped() int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

// free unmaps every array; it is idempotent.
func (m *PageMem) free() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, u := range m.unmaps {
		errs = append(errs, u())
	}
	m.unmaps = nil
	return errors.Join(errs...)
}

// ErrClosed is what a storage used after Close returns.
var ErrClosed = errors.New("kvcache: storage used after Close")

// Close releases the pages' memory. Nothing may run on the storage (or
// the cache embedding it) meanwhile or afterwards: Begin then fails with
// ErrClosed, and the pages are gone, so a Store or Attend that slipped
// past it panics on a nil page set instead of reading unmapped memory.
// A storage dropped without Close is released when the collector finds
// it unreachable. Close is idempotent.
func (kv *Storage) Close() error {
	if kv.mem == nil {
		return nil
	}
	for i := range kv.layers {
		kv.layers[i].k, kv.layers[i].v = nil, nil
	}
	kv.closed = true
	kv.cleanup.Stop()
	return kv.mem.free()
}

// MappedBytes is the page memory the storage reserved outside the Go
// heap (0 after Close); resident memory is what has been written of it.
func (kv *Storage) MappedBytes() int64 {
	if kv.closed {
		return 0
	}
	return kv.mem.Mapped()
}

// newPageMem makes kv's page memory and arranges its release should kv
// be dropped unclosed.
func (kv *Storage) newPageMem() {
	kv.mem = new(PageMem)
	kv.cleanup = runtime.AddCleanup(kv, func(m *PageMem) { m.free() }, kv.mem)
}
