package kernels

import (
	"fmt"
	"os"
	"sync"
)

var isaMu sync.Mutex

// isaNames lists the instruction sets this build can run, best first;
// "generic" (the plain Go references) is always last.
var isaNames = []string{"generic"}

// activeISA is the instruction set the dispatch variables point at.
var activeISA = "generic"

// ISA reports the instruction set in use ("avx512" or "generic").
func ISA() string { return activeISA }

// ISAs lists the instruction sets usable on this CPU, best first.
func ISAs() []string { return append([]string(nil), isaNames...) }

// SetISA switches every kernel to the named instruction set; "generic" forces
// the plain Go references (for tests and comparisons). It is not safe to call
// while kernels run.
func SetISA(name string) error {
	isaMu.Lock()
	defer isaMu.Unlock()
	for _, n := range isaNames {
		if n == name {
			setGeneric()
			if name != "generic" {
				setSIMD(name)
			}
			activeISA = name
			return nil
		}
	}
	return fmt.Errorf("kernels: instruction set %q not available (have %v)", name, isaNames)
}

// packedOn is set while the active kernels use the packed weight layouts,
// asmQuant selects the AVX-512 activation quantizers, useAVX2 the AVX2
// forms of the matmul kernels.
var packedOn, asmQuant, useAVX2 bool

// setGeneric points every dispatch variable at its reference.
func setGeneric() {
	packedOn, asmQuant, useAVX2 = false, false, false
	matMul = MatMulRef
	matMulN = MatMulNRef
	rmsNorm = RMSNormRef
	softmax = SoftmaxRef
	siluMul = SiLUMulRef
	dotF32 = DotF32Ref
	axpyF32 = AxpyF32Ref
	scaleF32 = ScaleF32Ref
	dotF16 = DotF16Ref
	axpyF16 = AxpyF16Ref
	dotBF16 = DotBF16Ref
	axpyBF16 = AxpyBF16Ref
	f32ToF16Row = F32ToF16RowRef
	f16ToF32Row = F16ToF32RowRef
	bf16ToF32Row = BF16ToF32RowRef
	f32ToBF16Row = F32ToBF16RowRef
	attnScoresF32 = AttnScoresF32Ref
	attnScoresF16 = AttnScoresF16Ref
	attnScoresBF16 = AttnScoresBF16Ref
	attnMixF32 = AttnMixF32Ref
	attnMixF16 = AttnMixF16Ref
	attnMixBF16 = AttnMixBF16Ref
}

// applyEnvISA honours PAGODA_ISA (avx512, avx2, generic) so whole test runs
// and benchmarks can be repeated on a lesser instruction set. An unknown or
// unavailable name leaves the best one in place.
func applyEnvISA() {
	if v := os.Getenv("PAGODA_ISA"); v != "" {
		SetISA(v)
	}
}
