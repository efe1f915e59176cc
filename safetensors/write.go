package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
)

// Write writes tensors (in the given order) to path as one safetensors file.
func Write(path string, tensors []*Tensor) error {
	return WriteWithMetadata(path, tensors, nil)
}

// WriteWithMetadata is Write with a __metadata__ string map.
func WriteWithMetadata(path string, tensors []*Tensor, meta map[string]string) error {
	b, err := Marshal(tensors, meta)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// Marshal encodes tensors as a safetensors file. The header is padded with
// spaces to a multiple of 8 bytes, as the reference writer does.
func Marshal(tensors []*Tensor, meta map[string]string) ([]byte, error) {
	hdr := map[string]any{}
	if len(meta) > 0 {
		hdr["__metadata__"] = meta
	}
	var off uint64
	for _, t := range tensors {
		if t.Name == "__metadata__" || t.Name == "" {
			return nil, fmt.Errorf("safetensors: invalid tensor name %q", t.Name)
		}
		if _, dup := hdr[t.Name]; dup {
			return nil, fmt.Errorf("safetensors: tensor %q written twice", t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		e := headerEntry{DType: t.DType, Shape: shape, DataOffsets: []uint64{off, off + uint64(len(t.Data))}}
		hdr[t.Name] = e
		off += uint64(len(t.Data))
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	// Check what we write with the reader's own rules.
	if _, _, err := ParseHeader(js); err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var buf bytes.Buffer
	buf.Grow(8 + len(js) + int(off))
	buf.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(js))))
	buf.Write(js)
	for _, t := range tensors {
		buf.Write(t.Data)
	}
	return buf.Bytes(), nil
}
