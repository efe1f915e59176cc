package convert

import (
	"fmt"
	"io"
	"log"

	"pagoda/gguf"
	"pagoda/quant"
)

// ConvertOptions configure ToGGUF.
type ConvertOptions struct {
	// Tokenizer names a GGUF file, llama2.c tokenizer.bin or byte-level
	// BPE tokenizer.json whose vocabulary is written as the tokenizer.*
	// metadata. Without it an HF directory's own tokenizer.json is used
	// when it converts; llama2.c checkpoints carry no vocabulary.
	Tokenizer string
	// Progress, when set, is called after each tensor is written.
	Progress func(done, total int)
	// Warn receives warnings (a tokenizer that could not be converted);
	// nil logs them with the standard logger.
	Warn func(msg string)
}

// ToGGUF writes the model at in (a llama2.c checkpoint, a Hugging Face
// directory, or a GGUF file to re-tokenize) as a GGUF file at out with
// llama.cpp's tensor names and metadata. Matrices keep their stored type
// (F32, F16, BF16; Q8_0 for lossless llama2.c int8 checkpoints; GPTQ/AWQ
// layers as Q4_0, Q4_1, Q8_0 or F16, see gptq.go); 1-D tensors are F32;
// HF llama q/k rows are reordered for ggml's rope.
func ToGGUF(in, out string, o ConvertOptions) error {
	if err := toGGUF(in, out, o); err != nil {
		return fmt.Errorf("convert: %s: %w", in, err)
	}
	return nil
}

func toGGUF(in, out string, o ConvertOptions) error {
	src, err := openSource(in, o.Tokenizer)
	if err != nil {
		return err
	}
	defer src.Close()
	for _, msg := range src.warnings {
		if o.Warn != nil {
			o.Warn(msg)
		} else {
			log.Print("convert: warning: " + msg)
		}
	}
	if _, ok := src.get("general.file_type"); !ok {
		if err := src.setKV("general.file_type", storedFileType(src.tensors)); err != nil {
			return err
		}
	}
	w := gguf.NewWriter()
	for _, kv := range src.kv {
		if err := w.Set(kv.Key, kv.Value); err != nil {
			return fmt.Errorf("metadata %s: %w", kv.Key, err)
		}
	}
	done := 0
	for _, t := range src.tensors {
		t := t
		size, err := tensorSize(t.typ, t.dims)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.name, err)
		}
		err = w.AddTensorFunc(t.name, t.typ, t.dims, size, func(out io.Writer) error {
			if err := writeTensor(out, t, t.typ, 1); err != nil {
				return err
			}
			done++
			if o.Progress != nil {
				o.Progress(done, len(src.tensors))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return w.WriteFile(out)
}

// storedFileType is the llama_ftype describing the matrices as stored: the
// type holding most of their elements.
func storedFileType(ts []*srcTensor) uint32 {
	count := map[quant.Type]uint64{}
	for _, t := range ts {
		if nDims(t.dims) >= 2 {
			n := uint64(1)
			for _, d := range t.dims {
				n *= d
			}
			count[t.typ] += n
		}
	}
	best, bestN := quant.F32, uint64(0)
	for t, n := range count {
		if n > bestN || (n == bestN && t < best) {
			best, bestN = t, n
		}
	}
	for _, ft := range fileTypes {
		if ft.base == best && ft.mix == defaultMix(best) {
			return ft.id
		}
	}
	return 0
}
