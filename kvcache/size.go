package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"
)

// Shape is the part of a model's configuration the KV cache size depends on.
type Shape struct {
	Name                            string
	NLayer, NHead, NKVHead, HeadDim int
}

// shapes are published configurations, for sizing without the weights.
var shapes = map[string]Shape{
	"llama-2-7b":   {"Llama-2-7B", 32, 32, 32, 128},
	"llama-2-13b":  {"Llama-2-13B", 40, 40, 40, 128},
	"llama-2-70b":  {"Llama-2-70B", 80, 64, 8, 128},
	"llama-3-8b":   {"Llama-3-8B", 32, 32, 8, 128},
	"llama-3-70b":  {"Llama-3-70B", 80, 64, 8, 128},
	"mistral-7b":   {"Mistral-7B", 32, 32, 8, 128},
	"qwen2.5-7b":   {"Qwen2.5-7B", 28, 28, 4, 128},
	"qwen2.5-0.5b": {"Qwen2.5-0.5B", 24, 14, 2, 64},
	"tinyllama":    {"TinyLlama-1.1B", 22, 32, 4, 64},
	"stories15m":   {"stories15M", 6, 6, 6, 48},
	"stories260k":  {"stories260K", 5, 8, 4, 8},
}

// LookupShape finds a named shape, case-insensitively. A "-mha" suffix
// (e.g. "llama-2-70b-mha") gives the same model without grouped-query
// attention: one KV head per query head.
func LookupShape(name string) (Shape, error) {
	key := strings.ToLower(name)
	mha := strings.HasSuffix(key, "-mha")
	key = strings.TrimSuffix(key, "-mha")
	s, ok := shapes[key]
	if !ok {
		return Shape{}, fmt.Errorf("kvcache: unknown model shape %q (known: %s)", name, strings.Join(ShapeNames(), ", "))
	}
	if mha {
		s.Name += " (MHA)"
		s.NKVHead = s.NHead
	}
	return s, nil
}

// ShapeNames lists the named shapes.
func ShapeNames() []string {
	var names []string
	for k := range shapes {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// KVBytesPerToken is the cache bytes one token takes: K and V, every layer.
func KVBytesPerToken(s Shape, d DType) int64 {
	return 2 * int64(s.NLayer) * int64(s.NKVHead) * int64(s.HeadDim) * int64(d.Size())
}

// ErrTooLarge says a size does not fit an int64 byte count.
var ErrTooLarge = errors.New("kvcache: size overflows int64")

// Size is the cache bytes for batch sequences of length tokens each. With
// blockSize > 0 each sequence is rounded up to whole blocks, as the paged
// cache stores it. The inputs come from users (a command line, a model
// file), so the product is checked: past MaxInt64 it returns an error
// wrapping ErrTooLarge rather than a wrapped, negative count.
func Size(s Shape, batch, length int, d DType, blockSize int) (int64, error) {
	if batch < 0 || length < 0 || blockSize < 0 || s.NLayer < 0 || s.NKVHead < 0 || s.HeadDim < 0 {
		return 0, fmt.Errorf("kvcache: negative size input: batch %d, length %d, block size %d, shape %d×%d×%d",
			batch, length, blockSize, s.NLayer, s.NKVHead, s.HeadDim)
	}
	n := uint64(length)
	if blockSize > 0 {
		// Cannot wrap: length < 2^63 and the round-up adds under 2^63.
		bs := uint64(blockSize)
		n = (n/bs + min(n%bs, 1)) * bs
	}
	total := uint64(1)
	for _, f := range []uint64{2, uint64(s.NLayer), uint64(s.NKVHead), uint64(s.HeadDim), uint64(d.Size()), n, uint64(batch)} {
		hi, lo := bits.Mul64(total, f)
		if hi != 0 || lo > math.MaxInt64 {
			approx := float64(KVBytesPerToken(s, d)) * float64(n) * float64(batch)
			return 0, fmt.Errorf("%w: %d sequences × %d tokens × %d bytes a token is about %.3g bytes", ErrTooLarge, batch, length, KVBytesPerToken(s, d), approx)
		}
		total = lo
	}
	return int64(total), nil
}
