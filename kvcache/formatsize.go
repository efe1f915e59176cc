package kvcache

import "fmt"

// FormatNames lists every KV storage format by its canonical name, widest
// first.
func FormatNames() []string {
	names := []string{F32.String(), F16.String(), BF16.String()}
	for _, f := range blockFormats {
		names = append(names, f.String())
	}
	return append(names, "kivi4", "kivi2")
}

// FormatSize is what a token costs in one K/V format pairing on a shape.
type FormatSize struct {
	K, V      Format
	BlockSize int
	// BytesPerToken is pool storage: codes or elements and their scales,
	// K and V, every layer (a block's bytes over its tokens).
	BytesPerToken float64
	// ResidualPerSeq is the most f16 storage a sequence holds beside the
	// pool (KIVI's residual window), every layer, K and V.
	ResidualPerSeq int64
	Err            error // the shape cannot store this format
}

// SizeOf sizes K format k and V format v on s. blockSize 0 means the
// format's own (FormatBlockSize).
func SizeOf(s Shape, k, v Format, blockSize int) FormatSize {
	fs := FormatSize{K: k, V: v, BlockSize: blockSize}
	if fs.BlockSize == 0 {
		fs.BlockSize = max(FormatBlockSize(k), FormatBlockSize(v))
	}
	cfg := Config{NLayer: s.NLayer, NKVHead: s.NKVHead, HeadDim: s.HeadDim, BlockSize: fs.BlockSize, KFormat: k, VFormat: v}
	g := cfg.groups()[0]
	for _, f := range []Format{g.KFormat, g.VFormat} {
		if err := checkDim(f, s.HeadDim); err != nil {
			fs.Err = err
			return fs
		}
		if err := checkBlock(f, fs.BlockSize); err != nil {
			fs.Err = err
			return fs
		}
		if r, ok := f.(interface{ ResidualBytes(heads, dim int) int }); ok {
			fs.ResidualPerSeq += int64(s.NLayer) * int64(r.ResidualBytes(s.NKVHead, s.HeadDim))
		}
	}
	fs.BytesPerToken = float64(cfg.BlockBytes()) / float64(fs.BlockSize)
	return fs
}

// SeqsThatFit is how many sequences of length tokens a budget of bytes
// holds in format size fs: whole blocks each, plus a full residual window
// (an upper bound for sequences shorter than it).
func (fs FormatSize) SeqsThatFit(budget int64, length int) (int64, error) {
	if fs.Err != nil {
		return 0, fs.Err
	}
	if length <= 0 || budget < 0 {
		return 0, fmt.Errorf("kvcache: %d tokens in %d bytes", length, budget)
	}
	blocks := (length + fs.BlockSize - 1) / fs.BlockSize
	per := fs.BytesPerToken*float64(blocks*fs.BlockSize) + float64(fs.ResidualPerSeq)
	return int64(float64(budget) / per), nil
}
