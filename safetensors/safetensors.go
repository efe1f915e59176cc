// Package safetensors reads Hugging Face *.safetensors files over mmap,
// single or sharded (model.safetensors.index.json), and writes small ones
// for tests.
//
// A file is an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets} (plus an optional
// "__metadata__" string map), then the raw little-endian tensor bytes.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"

	"pagoda/mmapfile"
)

// maxHeader matches the reference implementation's 100 MB header limit.
const maxHeader = 100 << 20

// Tensor is one tensor; Data views the file mapping and stays valid until
// the owning File or Set is closed.
type Tensor struct {
	Name  string
	DType string
	// Shape is in PyTorch order: the last dimension is contiguous.
	Shape []int64
	Data  []byte
}

// Elements returns the product of Shape.
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// dtypeBits gives the storage width of every dtype the safetensors format
// names; tensors of other dtypes are an error.
var dtypeBits = map[string]int{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
	"U16": 16, "I16": 16, "F16": 16, "BF16": 16,
	"U32": 32, "I32": 32, "F32": 32,
	"U64": 64, "I64": 64, "F64": 64, "C64": 64,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

// DTypeBits returns the bits per element of a safetensors dtype name.
func DTypeBits(dtype string) (int, bool) {
	b, ok := dtypeBits[dtype]
	return b, ok
}

// File is one opened safetensors file.
type File struct {
	Path     string
	Metadata map[string]string
	// Tensors in data order.
	Tensors []*Tensor

	index map[string]*Tensor
	unmap func() error
}

// Open maps and parses the file at path.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors: %s: file is %d bytes, too short for a header", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("safetensors: %s: file of %d bytes does not fit in memory", path, size)
	}
	b, unmap, err := mmapfile.Map(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f, err := parse(b)
	if err != nil {
		unmap()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f.Path = path
	f.unmap = unmap
	return f, nil
}

// Parse parses a safetensors file held in memory; tensor Data aliases b.
func Parse(b []byte) (*File, error) {
	f, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return f, nil
}

// Close releases the mapping. Closing twice is harmless.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	u := f.unmap
	f.unmap = nil
	return u()
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (*Tensor, bool) {
	t, ok := f.index[name]
	return t, ok
}

// Names returns the tensor names in data order.
func (f *File) Names() []string {
	out := make([]string, len(f.Tensors))
	for i, t := range f.Tensors {
		out[i] = t.Name
	}
	return out
}

type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

func parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%d bytes, too short for a header", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("header length %d exceeds the %d bytes that follow", n, len(b)-8)
	}
	if n > maxHeader {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, maxHeader)
	}
	hdr := b[8 : 8+n]
	data := b[8+n:]
	entries, meta, err := ParseHeader(hdr)
	if err != nil {
		return nil, err
	}
	f := &File{Metadata: meta, index: make(map[string]*Tensor, len(entries))}
	type placed struct {
		t     *Tensor
		begin uint64
	}
	var order []placed
	for name, e := range entries {
		lo, hi := e.DataOffsets[0], e.DataOffsets[1]
		if hi > uint64(len(data)) {
			return nil, fmt.Errorf("tensor %q: data offsets [%d, %d) lie beyond the %d data bytes", name, lo, hi, len(data))
		}
		t := &Tensor{Name: name, DType: e.DType, Shape: e.Shape, Data: data[lo:hi:hi]}
		f.index[name] = t
		order = append(order, placed{t, lo})
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].begin != order[j].begin {
			return order[i].begin < order[j].begin
		}
		return order[i].t.Name < order[j].t.Name
	})
	for _, p := range order {
		f.Tensors = append(f.Tensors, p.t)
	}
	return f, nil
}

// Entry is one tensor's header record.
type Entry struct {
	DType       string
	Shape       []int64
	DataOffsets [2]uint64
}

// ParseHeader decodes and checks the JSON header: known dtypes,
// non-negative shapes whose byte size matches the data offsets. Offsets
// are not checked against a file size here.
func ParseHeader(hdr []byte) (map[string]Entry, map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, nil, fmt.Errorf("header: %w", err)
	}
	var meta map[string]string
	out := make(map[string]Entry, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("__metadata__: must map strings to strings: %w", err)
			}
			continue
		}
		if name == "" {
			return nil, nil, fmt.Errorf("tensor with an empty name")
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		bitsPer, ok := dtypeBits[e.DType]
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
		}
		if e.Shape == nil {
			return nil, nil, fmt.Errorf("tensor %q: no shape", name)
		}
		if len(e.DataOffsets) != 2 {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets has %d values, want 2", name, len(e.DataOffsets))
		}
		lo, hi := e.DataOffsets[0], e.DataOffsets[1]
		if lo > hi {
			return nil, nil, fmt.Errorf("tensor %q: data offsets [%d, %d) are reversed", name, lo, hi)
		}
		elems := uint64(1)
		for _, d := range e.Shape {
			if d < 0 {
				return nil, nil, fmt.Errorf("tensor %q: negative dimension in shape %v", name, e.Shape)
			}
			h, l := bits.Mul64(elems, uint64(d))
			if h != 0 || l > math.MaxInt64 {
				return nil, nil, fmt.Errorf("tensor %q: shape %v overflows", name, e.Shape)
			}
			elems = l
		}
		h, nbits := bits.Mul64(elems, uint64(bitsPer))
		if h != 0 || nbits%8 != 0 {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s is not a whole number of bytes", name, e.Shape, e.DType)
		}
		if hi-lo != nbits/8 {
			return nil, nil, fmt.Errorf("tensor %q: %s %v needs %d bytes, data offsets [%d, %d) hold %d", name, e.DType, e.Shape, nbits/8, lo, hi, hi-lo)
		}
		out[name] = Entry{DType: e.DType, Shape: e.Shape, DataOffsets: [2]uint64{lo, hi}}
	}
	return out, meta, nil
}

// Float32 converts an F32, F16, BF16 or F64 tensor to float32.
func (t *Tensor) Float32() ([]float32, error) {
	n := t.Elements()
	le := binary.LittleEndian
	switch t.DType {
	case "F32":
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(t.Data[4*i:]))
		}
		return out, nil
	case "F16":
		out := make([]float32, n)
		for i := range out {
			out[i] = f16ToF32(le.Uint16(t.Data[2*i:]))
		}
		return out, nil
	case "BF16":
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(uint32(le.Uint16(t.Data[2*i:])) << 16)
		}
		return out, nil
	case "F64":
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(math.Float64frombits(le.Uint64(t.Data[8*i:])))
		}
		return out, nil
	}
	return nil, fmt.Errorf("safetensors: tensor %q: cannot convert dtype %s to float32", t.Name, t.DType)
}

// f16ToF32 widens an IEEE half, subnormals and NaN payloads included.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = mant * 2^-24.
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}
