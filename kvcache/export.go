package kvcache

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
)

// Export and import move the stored K/V of pages between storages as
// bytes, exactly: the seam for prefill/decode disaggregation (a prefill
// worker ships a sequence's blocks to a decode worker) and for preemption
// by swapping to host memory instead of recomputing. The KV manager says
// which pages (a sequence's block table on each side); the storage only
// copies bytes.

// pageCodec is Pages whose pages can be read out and written back as bytes
// without loss.
type pageCodec interface {
	// AppendPage appends page's bytes (rows and any metadata) to dst.
	AppendPage(dst []byte, page int) []byte
	// SetPage overwrites page with what AppendPage gave, and reports how
	// many bytes of src it used.
	SetPage(page int, src []byte) (int, error)
}

// ExportPages appends the K/V of pages (layer by layer, keys then values,
// pages in the order given; released entries, -1, are skipped) to dst.
func (kv *Storage) ExportPages(dst []byte, pages []int32) ([]byte, error) {
	if kv.closed {
		return dst, ErrClosed
	}
	defer runtime.KeepAlive(kv)
	for li := range kv.layers {
		for _, p := range kv.layerPages(li) {
			pc, ok := codecOf(p)
			if !ok {
				return dst, fmt.Errorf("kvcache: pages of %T cannot be exported", p)
			}
			for _, pg := range pages {
				if pg != released {
					dst = pc.AppendPage(dst, int(pg))
				}
			}
		}
	}
	return dst, nil
}

// ImportPages writes what ExportPages gave into pages (the importing
// side's block table for the same positions, released entries in the same
// places), checking that src is exactly that much data.
func (kv *Storage) ImportPages(pages []int32, src []byte) error {
	if kv.closed {
		return ErrClosed
	}
	defer runtime.KeepAlive(kv)
	for li := range kv.layers {
		for _, p := range kv.layerPages(li) {
			pc, ok := codecOf(p)
			if !ok {
				return fmt.Errorf("kvcache: pages of %T cannot be imported", p)
			}
			for _, pg := range pages {
				if pg == released {
					continue
				}
				if pg < 0 || int(pg) >= kv.npages {
					return fmt.Errorf("kvcache: import into page %d of %d", pg, kv.npages)
				}
				kv.written[pg]++
				n, err := pc.SetPage(int(pg), src)
				if err != nil {
					return err
				}
				src = src[n:]
			}
		}
	}
	if len(src) != 0 {
		return fmt.Errorf("kvcache: %d bytes left after importing %d pages", len(src), len(pages))
	}
	return nil
}

func (kv *Storage) layerPages(li int) []Pages {
	ls := &kv.layers[li]
	if ls.v == nil {
		return []Pages{ls.k}
	}
	return []Pages{ls.k, ls.v}
}

func (p *floatPages[E]) AppendPage(dst []byte, page int) []byte {
	switch d := any(p.data).(type) {
	case []float32:
		for _, v := range d[page*p.pageLen : (page+1)*p.pageLen] {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	case []uint16:
		for _, v := range d[page*p.pageLen : (page+1)*p.pageLen] {
			dst = binary.LittleEndian.AppendUint16(dst, v)
		}
	}
	return dst
}

func (p *floatPages[E]) SetPage(page int, src []byte) (int, error) {
	switch d := any(p.data).(type) {
	case []float32:
		n := 4 * p.pageLen
		if len(src) < n {
			return 0, fmt.Errorf("kvcache: import of a page of %d bytes from %d", n, len(src))
		}
		for i := range d[page*p.pageLen : (page+1)*p.pageLen] {
			d[page*p.pageLen+i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		return n, nil
	case []uint16:
		n := 2 * p.pageLen
		if len(src) < n {
			return 0, fmt.Errorf("kvcache: import of a page of %d bytes from %d", n, len(src))
		}
		for i := range d[page*p.pageLen : (page+1)*p.pageLen] {
			d[page*p.pageLen+i] = binary.LittleEndian.Uint16(src[2*i:])
		}
		return n, nil
	}
	return 0, fmt.Errorf("kvcache: pages of %T cannot be imported", p.data)
}

func (p *blockPages) AppendPage(dst []byte, page int) []byte {
	return append(dst, p.data[page*p.pageBytes:(page+1)*p.pageBytes]...)
}

func (p *blockPages) SetPage(page int, src []byte) (int, error) {
	if len(src) < p.pageBytes {
		return 0, fmt.Errorf("kvcache: import of a page of %d bytes from %d", p.pageBytes, len(src))
	}
	return copy(p.data[page*p.pageBytes:(page+1)*p.pageBytes], src), nil
}

// codecOf is p's byte form, looking through a wrapper that keeps a subset
// of channels (its pages are its inner pages).
func codecOf(p Pages) (pageCodec, bool) {
	if cp, ok := p.(*channelPages); ok {
		return codecOf(cp.inner)
	}
	pc, ok := p.(pageCodec)
	return pc, ok
}
