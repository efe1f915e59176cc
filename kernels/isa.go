package kernels

import (
	"fmt"
	"os"
	"unsafe"
)

// Ops is the kernel set of one instruction set. Each value is built once, at
// package initialisation, and never changes, so any number of goroutines may
// use different Ops side by side (a test holding AVX2 against the generic
// references while another runs AVX-512) without coordinating.
//
// The methods compute exactly what the package-level functions of the same
// names compute, with this set's kernels; the package-level functions use
// Best.
type Ops struct {
	name string
	// packed: quantized weights run through the packed layouts of pack.go;
	// asmQuant: activations are quantized by the AVX-512 assembly; avx2:
	// the AVX2 forms of the packed and float matmuls (and the generic
	// packed layouts they read).
	packed, asmQuant, avx2 bool

	matMul  func(p *Pool, w *Matrix, x, out []float32, batch int)
	matMulN func(p *Pool, ws []*Matrix, x []float32, outs [][]float32, batch int)
	rmsNorm func(out, x, w []float32, eps float32)
	softmax func(x []float32)
	siluMul func(out, g, u []float32)
	rope    func(x []float32, pos int, freqs []float32, neox bool)

	dotF32       func(a, b []float32) float32
	axpyF32      func(out []float32, a float32, x []float32)
	scaleF32     func(x []float32, a float32)
	dotF16       func(q []float32, k []uint16) float32
	axpyF16      func(out []float32, a float32, v []uint16)
	dotBF16      func(q []float32, k []uint16) float32
	axpyBF16     func(out []float32, a float32, v []uint16)
	f32ToF16Row  func(dst []uint16, src []float32)
	f16ToF32Row  func(dst []float32, src []uint16)
	bf16ToF32Row func(dst []float32, src []uint16)
	f32ToBF16Row func(dst []uint16, src []float32)

	attnScoresF32  func(s, q, k []float32, stride int)
	attnScoresF16  func(s, q []float32, k []uint16, stride int)
	attnScoresBF16 func(s, q []float32, k []uint16, stride int)
	attnMixF32     func(out, w, v []float32, stride int)
	attnMixF16     func(out, w []float32, v []uint16, stride int)
	attnMixBF16    func(out, w []float32, v []uint16, stride int)

	peak peakProbe // the int8 peak probe (Int8Peak); none without VNNI
	h4   heads4    // none in the generic set
	tile tiles     // none in the generic set
}

// peakProbe is a set's int8 peak loop: n iterations of 1024 multiply-adds,
// returning a sum that keeps them live; nil where the set has none.
type peakProbe struct{ loop func(n int) int32 }

// tiles is a set's assembly for tiled attention (attntile.go): the key
// transposition per element type, the scores of 1..8 heads against one
// tile, and mixes of 1..8 heads (mix4's loop).
type tiles struct {
	tileF32, tileF16, tileBF16 func(kt *float32, k unsafe.Pointer, stride, d int)
	scores                     [9]func(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)
	mixF32, mixF16, mixBF16    [9]func(out, w *float32, v unsafe.Pointer, n, d, stride, ws int)
	softmaxOnline              func(x *float32, n int, scale, m float32) (mx, sum float32)
}

// heads4 is a set's assembly over four GQA heads at once (d a multiple of
// 16, strides in bytes); the exported wrappers fall back to the per-head
// kernels where it is nil.
type heads4 struct {
	scoresF32, scoresF16, scoresBF16 func(s, q *float32, k unsafe.Pointer, n, d, stride, ss int)
	mixF32, mixF16, mixBF16          func(out, w *float32, v unsafe.Pointer, n, d, stride, ws int)
}

// newGeneric is the set of plain Go references; the SIMD sets start from a
// copy of it and replace what they accelerate.
func newGeneric() *Ops {
	return &Ops{
		name:           "generic",
		matMul:         MatMulRef,
		matMulN:        MatMulNRef,
		rmsNorm:        RMSNormRef,
		softmax:        SoftmaxRef,
		siluMul:        SiLUMulRef,
		rope:           RoPERef,
		dotF32:         DotF32Ref,
		axpyF32:        AxpyF32Ref,
		scaleF32:       ScaleF32Ref,
		dotF16:         DotF16Ref,
		axpyF16:        AxpyF16Ref,
		dotBF16:        DotBF16Ref,
		axpyBF16:       AxpyBF16Ref,
		f32ToF16Row:    F32ToF16RowRef,
		f16ToF32Row:    F16ToF32RowRef,
		bf16ToF32Row:   BF16ToF32RowRef,
		f32ToBF16Row:   F32ToBF16RowRef,
		attnScoresF32:  AttnScoresF32Ref,
		attnScoresF16:  AttnScoresF16Ref,
		attnScoresBF16: AttnScoresBF16Ref,
		attnMixF32:     AttnMixF32Ref,
		attnMixF16:     AttnMixF16Ref,
		attnMixBF16:    AttnMixBF16Ref,
	}
}

var (
	// isaSets lists the instruction sets this build can run on this CPU,
	// best first; "generic" is always last.
	isaSets = availableISAs()
	// bestOps is the best set, or the one PAGODA_ISA names (avx512, avx2,
	// generic) so whole test runs and benchmarks can be repeated on a
	// lesser instruction set. The environment is read here only.
	bestOps = chooseISA(isaSets, os.Getenv("PAGODA_ISA"))
	// best is a copy of *bestOps at a fixed address: a package-level
	// function loads its kernel from it in one step, as it would from a
	// package-level function variable. Never written after initialisation.
	best = *bestOps
)

// chooseISA picks the set named env, or the first (best) one when env is
// empty, unknown or unavailable.
func chooseISA(sets []*Ops, env string) *Ops {
	for _, o := range sets {
		if o.name == env {
			return o
		}
	}
	return sets[0]
}

// ForISA returns the kernel set of the named instruction set ("avx512",
// "avx2" or "generic"), or an error when this build or CPU cannot run it.
func ForISA(name string) (*Ops, error) {
	for _, o := range isaSets {
		if o.name == name {
			return o, nil
		}
	}
	return nil, fmt.Errorf("kernels: instruction set %q not available (have %v)", name, ISAs())
}

// Generic returns the plain Go references, on every CPU.
func Generic() *Ops { return isaSets[len(isaSets)-1] }

// Best returns the set the package-level functions use: the best this CPU
// runs, unless PAGODA_ISA named another at start-up.
func Best() *Ops { return bestOps }

// Name is the instruction set of o ("avx512", "avx2" or "generic").
func (o *Ops) Name() string { return o.name }

// ISA reports the instruction set of Best ("avx512", "avx2" or "generic").
func ISA() string { return bestOps.name }

// ISAs lists the instruction sets usable on this CPU, best first.
func ISAs() []string {
	names := make([]string, len(isaSets))
	for i, o := range isaSets {
		names[i] = o.name
	}
	return names
}
