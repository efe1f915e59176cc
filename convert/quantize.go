package convert

import (
	"fmt"
	"io"
	"log"
	"runtime"
	"sort"
	"sync"

	"pagoda/gguf"
	"pagoda/quant"
)

// RequantizeError refuses to quantize a tensor that already is: the
// rounding errors add up. QuantizeOptions.AllowRequantize allows it.
type RequantizeError struct {
	Tensor string
	Type   quant.Type
}

func (e *RequantizeError) Error() string {
	return fmt.Sprintf("tensor %q is already %s: requantizing loses quality (QuantizeOptions.AllowRequantize allows it)", e.Tensor, e.Type)
}

// QuantizeOptions configure Quantize.
type QuantizeOptions struct {
	// Type is the target of the 2-D weights, e.g. quant.Q4_K.
	Type quant.Type
	// Mix is "" for llama-quantize's default mix of Type (Q4_K means
	// Q4_K_M), "S", "M" or "L" for the K-quant mixes, or "pure" to store
	// every 2-D weight in Type (llama-quantize --pure).
	Mix string
	// OutputType and EmbeddingType override the types of output.weight and
	// token_embd.weight (--output-tensor-type, --token-embedding-type);
	// 0 leaves them to the mix (so F32, whose id is 0, cannot be asked for
	// here).
	OutputType, EmbeddingType quant.Type
	// AllowRequantize permits inputs whose tensors are already quantized:
	// they are dequantized first, which loses more than quantizing the
	// original weights (llama-quantize --allow-requantize).
	AllowRequantize bool
	// Tokenizer names a GGUF file, llama2.c tokenizer.bin or byte-level
	// BPE tokenizer.json whose vocabulary replaces (or, for llama2.c and HF
	// inputs, supplies) the tokenizer metadata.
	Tokenizer string
	// Threads quantizing rows in parallel (0 = GOMAXPROCS).
	Threads int
	// Progress, when set, is called after each tensor is written.
	Progress func(done, total int)
	// Warn receives warnings (requantizing, fallback types); nil logs them
	// with the standard logger.
	Warn func(msg string)
}

func (o *QuantizeOptions) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if o.Warn != nil {
		o.Warn(msg)
		return
	}
	log.Print("convert: warning: " + msg)
}

// droppedKeys are input metadata llama-quantize does not carry over: it
// rewrites the first two at the end and writes one file, not shards.
var droppedKeys = map[string]bool{
	"general.file_type":            true,
	"general.quantization_version": true,
	"split.no":                     true,
	"split.count":                  true,
	"split.tensors.count":          true,
}

// Quantize converts the model at in (GGUF, llama2.c checkpoint or Hugging
// Face directory) to a GGUF file at out whose tensors have the types
// llama-quantize would give them. Tensors are converted one at a time,
// rows in parallel, and written as they are done, so memory stays at a few
// MiB beyond the mapped input. The file appears only when complete.
func Quantize(in, out string, o QuantizeOptions) error {
	if err := quantize(in, out, o); err != nil {
		return fmt.Errorf("convert: quantize %s: %w", in, err)
	}
	return nil
}

// TensorPlan is what Quantize does with one tensor.
type TensorPlan struct {
	Name     string
	Dims     []uint64
	From, To quant.Type
	// Bytes is the tensor's size in the output file.
	Bytes int
}

// Plan returns the tensors Quantize would write, in file order, with
// their types, without converting anything (llama-quantize --dry-run). It
// fails where Quantize would fail before writing.
func Plan(in string, o QuantizeOptions) ([]TensorPlan, error) {
	src, _, plan, err := makePlan(in, &o)
	if err != nil {
		return nil, fmt.Errorf("convert: quantize %s: %w", in, err)
	}
	defer src.Close()
	out := make([]TensorPlan, len(plan))
	for i, p := range plan {
		out[i] = TensorPlan{Name: p.src.name, Dims: p.src.dims, From: p.src.typ, To: p.to, Bytes: p.bytes}
	}
	return out, nil
}

type plannedTensor struct {
	src   *srcTensor
	to    quant.Type
	bytes int
}

// makePlan opens the input and picks every tensor's type; the caller
// closes the source.
func makePlan(in string, o *QuantizeOptions) (*source, *fileType, []plannedTensor, error) {
	ft, pure, err := resolveFileType(o.Type, o.Mix)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, t := range []quant.Type{o.OutputType, o.EmbeddingType} {
		if t != 0 && !canQuantizeTo(t) {
			return nil, nil, nil, fmt.Errorf("cannot store tensors as %s", t)
		}
	}
	src, err := openSource(in, o.Tokenizer)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, w := range src.warnings {
		o.warn("%s", w)
	}
	plan, err := planTensors(src, ft, pure, o)
	if err != nil {
		src.Close()
		return nil, nil, nil, err
	}
	return src, ft, plan, nil
}

func planTensors(src *source, ft *fileType, pure bool, o *QuantizeOptions) ([]plannedTensor, error) {
	// llama-quantize visits (and writes) tensors in weight_name_comparer
	// order; its layer counters depend on it.
	ts := append([]*srcTensor(nil), src.tensors...)
	sort.SliceStable(ts, func(i, j int) bool { return weightNameLess(ts[i].name, ts[j].name) })
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.name
	}
	p := newPlanner(ft, pure, o.OutputType, o.EmbeddingType, src.hparams(), names)
	if p.nFFNDown == 0 {
		for _, n := range names {
			if tensorCategory(n) == catFFNDown {
				p.nFFNDown++
			}
		}
	}
	plan := make([]plannedTensor, len(ts))
	var requant []string
	for i, t := range ts {
		if len(t.dims) == 0 {
			return nil, fmt.Errorf("tensor %q: no dimensions", t.name)
		}
		to, err := p.target(t.name, t.typ, t.dims)
		if err != nil {
			return nil, err
		}
		if to != t.typ {
			if !canQuantizeTo(to) {
				return nil, fmt.Errorf("tensor %q: cannot quantize to %s", t.name, to)
			}
			if !t.typ.Supported() {
				return nil, fmt.Errorf("tensor %q: type %s cannot be converted (no dequantizer)", t.name, t.typ)
			}
			if isQuantized(t.typ) {
				if !o.AllowRequantize {
					return nil, &RequantizeError{Tensor: t.name, Type: t.typ}
				}
				requant = append(requant, t.name)
			}
		}
		size, err := tensorSize(to, t.dims)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.name, err)
		}
		plan[i] = plannedTensor{t, to, size}
	}
	if len(requant) > 0 {
		o.warn("requantizing %d already-quantized tensors (first %q): quality will be worse than quantizing the original F32/F16/BF16 weights", len(requant), requant[0])
	}
	if p.fallbacks > 0 {
		o.warn("%d of %d tensors have rows that are not a whole number of blocks and use a fallback type", p.fallbacks, len(ts))
	}
	return plan, nil
}

func quantize(in, out string, o QuantizeOptions) error {
	src, ft, plan, err := makePlan(in, &o)
	if err != nil {
		return err
	}
	defer src.Close()

	w := gguf.NewWriter()
	for _, kv := range src.kv {
		if droppedKeys[kv.Key] {
			continue
		}
		if err := w.Set(kv.Key, kv.Value); err != nil {
			return fmt.Errorf("metadata %s: %w", kv.Key, err)
		}
	}
	if err := w.Set("general.quantization_version", uint32(2)); err != nil {
		return err
	}
	if err := w.Set("general.file_type", ft.id); err != nil {
		return err
	}
	threads := o.Threads
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	done := 0
	for _, pt := range plan {
		pt := pt
		t := pt.src
		err := w.AddTensorFunc(t.name, pt.to, t.dims, pt.bytes, func(out io.Writer) error {
			// The writer names the tensor in its errors.
			if err := writeTensor(out, t, pt.to, threads); err != nil {
				return err
			}
			done++
			if o.Progress != nil {
				o.Progress(done, len(plan))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return w.WriteFile(out)
}

// canQuantizeTo reports whether package quant can encode type t.
func canQuantizeTo(t quant.Type) bool {
	switch t {
	case quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0,
		quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_NL, quant.IQ4_XS, quant.MXFP4:
		return t.Supported()
	}
	return false
}

func tensorSize(t quant.Type, dims []uint64) (int, error) {
	row, err := quant.RowSize(t, int(dims[0]))
	if err != nil {
		return 0, err
	}
	n := row
	for _, d := range dims[1:] {
		n *= int(d)
	}
	return n, nil
}

// chunkElems is the work of one job: large enough to amortise scheduling,
// small enough that threads × (float buffer + output) stays a few MiB.
const chunkElems = 1 << 18

// writeTensor writes t converted to type to. Chunks of rows are converted
// in parallel and written in order.
func writeTensor(out io.Writer, t *srcTensor, to quant.Type, threads int) error {
	data, err := t.data()
	if err != nil {
		return err
	}
	rowLen, rows := int(t.dims[0]), t.rows()
	inRow, err := quant.RowSize(t.typ, rowLen)
	if err != nil {
		return err
	}
	if len(data) < inRow*rows {
		return fmt.Errorf("%d bytes of data, %s %v needs %d", len(data), t.typ, t.dims, inRow*rows)
	}
	if to == t.typ {
		_, err := out.Write(data[:inRow*rows])
		return err
	}
	outRow, err := quant.RowSize(to, rowLen)
	if err != nil {
		return err
	}
	chunkRows := max(1, chunkElems/rowLen)
	nChunks := (rows + chunkRows - 1) / chunkRows
	workers := max(1, min(threads, nChunks))
	type slot struct {
		f   []float32
		q   []byte
		n   int
		err error
	}
	slots := make([]slot, workers)
	for i := range slots {
		slots[i].f = make([]float32, chunkRows*rowLen)
		slots[i].q = make([]byte, chunkRows*outRow)
	}
	for first := 0; first < nChunks; first += workers {
		n := min(workers, nChunks-first)
		var wg sync.WaitGroup
		for k := 0; k < n; k++ {
			wg.Add(1)
			go func(s *slot, c int) {
				defer wg.Done()
				r0 := c * chunkRows
				nr := min(chunkRows, rows-r0)
				f := s.f[:nr*rowLen]
				s.n = nr * outRow
				if s.err = quant.Dequantize(t.typ, data[r0*inRow:(r0+nr)*inRow], f); s.err != nil {
					return
				}
				if s.err = quant.QuantizeInto(to, f, s.q[:s.n]); s.err != nil {
					s.err = fmt.Errorf("rows %d-%d: %w", r0, r0+nr-1, s.err)
				}
			}(&slots[k], first+k)
		}
		wg.Wait()
		for k := 0; k < n; k++ {
			if slots[k].err != nil {
				return slots[k].err
			}
			if _, err := out.Write(slots[k].q[:slots[k].n]); err != nil {
				return err
			}
		}
	}
	return nil
}
