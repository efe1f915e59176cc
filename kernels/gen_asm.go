//go:build ignore

// gen_asm writes matmul_amd64.s: the AVX-512 VNNI micro-kernels over the
// packed weight layouts of pack.go, one function per activation-tile height
// N = 1..8 (registers hold N accumulators, so N is baked in).
//
//	go run gen_asm.go
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"os"
)

var b bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }

// prefetch touches the weights about prefetchAhead bytes ahead of a loop
// that consumes step bytes per iteration: one core's hardware prefetcher
// alone left the decode products at ~18 GB/s of the ~30 this machine
// streams (2 threads, 600 MB matrix).
// storeRows writes the n accumulators Z16.. (16 outputs of one row of
// activations each) os bytes apart from R9: straight into the product's
// rows where the group is whole, so nothing is copied after.
func storeRows(n int) {
	p("MOVQ os+40(FP), R11")
	for i := 0; i < n; i++ {
		if i > 0 {
			p("ADDQ R11, R9")
		}
		p("VMOVUPS Z%d, (R9)", 16+i)
	}
}

func prefetch(step int) {
	for off := 0; off < step; off += 64 {
		p("PREFETCHT0 %d(DI)", max(1, prefetchAhead/step)*step+off)
	}
}

// prefetchAhead is how far ahead (bytes, rounded to whole blocks) the
// integer loops prefetch weights.
var prefetchAhead = 4608

// Register plan: Z0..Z7 weights (u8, 4 columns × 16 rows each), Z8..Z15
// integer sums per activation row, Z16..Z23 float accumulators per row,
// Z24 scales, Z25/Z26 temporaries, Z27 nibble mask, Z28 minima.

// constK: implicit-offset kinds — acc += d·(dx·Σq·x − cx), cx = K·dx·Σx
// precomputed per activation block. chunks is 8 (block 32) or 4 (block 16);
// nibble unpacks 4-bit values; the per-row scale d is f16 or f32.
func constK(name string, nibble bool, chunks int, f32scale bool, n int) {
	wbytes := 64 * chunks
	if nibble {
		wbytes /= 2
	}
	sbytes := 32
	if f32scale {
		sbytes = 64
	}
	blockBytes := wbytes + sbytes
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	if nibble {
		p("MOVL $0x0f0f0f0f, AX")
		p("VPBROADCASTD AX, Z27")
	}
	fmt.Fprintf(&b, "loop:\n")
	prefetch(blockBytes)
	if nibble {
		for k := 0; k < chunks/2; k++ {
			p("VMOVDQU8 %d(DI), Z%d", 64*k, k+4)
			p("VPANDD Z27, Z%d, Z%d", k+4, k)
			p("VPSRLW $4, Z%d, Z%d", k+4, k+4)
			p("VPANDD Z27, Z%d, Z%d", k+4, k+4)
		}
	} else {
		for k := 0; k < chunks; k++ {
			p("VMOVDQU8 %d(DI), Z%d", 64*k, k)
		}
	}
	if f32scale {
		p("VMOVUPS %d(DI), Z24", wbytes)
	} else {
		p("VCVTPH2PS %d(DI), Z24", wbytes)
	}
	// With few activation rows, one VPDPBUSD chain per row would serialise
	// on its latency (decode is then compute-bound, not memory-bound):
	// split each row's sum over up to four registers of Z8..Z15.
	parts := 1
	for parts < 4 && n*parts*2 <= 8 && chunks%(parts*2) == 0 {
		parts *= 2
	}
	acc := func(i, k int) int { return 8 + i*parts + k%parts }
	for i := 0; i < n*parts; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	// Interleave rows so each dot chain has independent neighbours.
	for k := 0; k < chunks; k++ {
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 4*chunks*i+4*k, k, acc(i, k))
		}
	}
	for i := 0; i < n; i++ {
		r := acc(i, 0)
		for j := 1; j < parts; j++ {
			p("VPADDD Z%d, Z%d, Z%d", acc(i, j), r, r)
		}
		p("VCVTDQ2PS Z%d, Z%d", r, r)
		p("VBROADCASTSS %d(DX), Z25", 8*i)
		p("VFMSUB213PS.BCST %d(DX), Z25, Z%d", 8*i+4, r)
		p("VFMADD231PS Z%d, Z24, Z%d", r, 16+i)
	}
	p("ADDQ $%d, DI", blockBytes)
	p("ADDQ $%d, SI", 4*chunks*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ CX")
	p("JNZ loop")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// sm16: 8-bit values, block 16, f32 scale S and offset M per row:
// acc += S·(dx·Σq·x) + M·sx, sx = dx·Σx precomputed per activation block.
func sm16(name string, n int) {
	const blockBytes = 256 + 128
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	fmt.Fprintf(&b, "loop:\n")
	prefetch(blockBytes)
	for k := 0; k < 4; k++ {
		p("VMOVDQU8 %d(DI), Z%d", 64*k, k)
	}
	p("VMOVUPS 256(DI), Z24")
	p("VMOVUPS 320(DI), Z28")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	for k := 0; k < 4; k++ {
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 16*i+4*k, k, 8+i)
		}
	}
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Z%d, Z%d", 8+i, 8+i)
		p("VMULPS.BCST %d(DX), Z%d, Z%d", 8*i, 8+i, 8+i)
		p("VFMADD231PS Z%d, Z24, Z%d", 8+i, 16+i)
		p("VFMADD231PS.BCST %d(DX), Z28, Z%d", 8*i+4, 16+i)
	}
	p("ADDQ $%d, DI", blockBytes)
	p("ADDQ $%d, SI", 16*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ CX")
	p("JNZ loop")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// floatGemm: 4 weight rows (F32, F16 or BF16) × n float32 activation rows,
// 16 columns per step; out receives the 4·n dot products, row i's four at
// out[4i:4i+4].
func floatGemm(wt string, n int) {
	name := fmt.Sprintf("gemm%s_4x%d", wt, n)
	wstep := 32
	if wt == "F32" {
		wstep = 64
	}
	fmt.Fprintf(&b, "\n// func %s(w *byte, ws int, x *float32, xs int, nblk int, out *float32)\n", name)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-48\n", name)
	p("MOVQ w+0(FP), DI")
	p("MOVQ ws+8(FP), R8")
	p("MOVQ x+16(FP), SI")
	p("MOVQ xs+24(FP), R11")
	p("MOVQ nblk+32(FP), CX")
	p("MOVQ out+40(FP), R9")
	p("LEAQ (R8)(R8*2), R10")
	p("LEAQ (R11)(R11*2), R12")
	for i := 0; i < 4*n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	waddr := []string{"(DI)", "(DI)(R8*1)", "(DI)(R8*2)", "(DI)(R10*1)"}
	xaddr := []string{"(SI)", "(SI)(R11*1)", "(SI)(R11*2)", "(SI)(R12*1)"}
	fmt.Fprintf(&b, "loop:\n")
	for r := 0; r < 4; r++ {
		switch wt {
		case "F32":
			p("VMOVUPS %s, Z%d", waddr[r], 16+r)
		case "F16":
			p("VCVTPH2PS %s, Z%d", waddr[r], 16+r)
		case "BF16":
			p("VPMOVZXWD %s, Z%d", waddr[r], 16+r)
			p("VPSLLD $16, Z%d, Z%d", 16+r, 16+r)
		}
	}
	for i := 0; i < n; i++ {
		p("VMOVUPS %s, Z%d", xaddr[i], 20+i)
	}
	for i := 0; i < n; i++ {
		for r := 0; r < 4; r++ {
			p("VFMADD231PS Z%d, Z%d, Z%d", 20+i, 16+r, 4*i+r)
		}
	}
	p("ADDQ $%d, DI", wstep)
	p("ADDQ $64, SI")
	p("DECQ CX")
	p("JNZ loop")
	// Horizontal sums: halve each accumulator to 128 bits, then two rounds
	// of VHADDPS leave the 4 row sums of activation row i in one register.
	for a := 0; a < 4*n; a++ {
		p("VEXTRACTF64X4 $1, Z%d, Y20", a)
		p("VADDPS Y20, Y%d, Y%d", a, a)
		p("VEXTRACTF32X4 $1, Y%d, X20", a)
		p("VADDPS X20, X%d, X%d", a, a)
	}
	for i := 0; i < n; i++ {
		a := 4 * i
		p("VHADDPS X%d, X%d, X%d", a+1, a, a)
		p("VHADDPS X%d, X%d, X%d", a+3, a+2, a+2)
		p("VHADDPS X%d, X%d, X%d", a+2, a, a)
		p("VMOVUPS X%d, %d(R9)", a, 16*i)
	}
	p("VZEROUPPER")
	p("RET")
}

// Vector kernels over rows: n need not be a multiple of 16; the tail uses a
// masked load/store (K1 = the low n%16 lanes).
type vecKind struct {
	name  string // suffix
	width int    // bytes per element of the second operand
	load  func(addr string, dst int, masked bool)
}

func loadF32(addr string, dst int, masked bool) {
	if masked {
		p("VMOVUPS.Z %s, K1, Z%d", addr, dst)
	} else {
		p("VMOVUPS %s, Z%d", addr, dst)
	}
}

func loadF16(addr string, dst int, masked bool) {
	if masked {
		p("VMOVDQU16.Z %s, K1, Y%d", addr, dst)
		p("VCVTPH2PS Y%d, Z%d", dst, dst)
	} else {
		p("VCVTPH2PS %s, Z%d", addr, dst)
	}
}

func loadBF16(addr string, dst int, masked bool) {
	if masked {
		p("VMOVDQU16.Z %s, K1, Y%d", addr, dst)
		p("VPMOVZXWD Y%d, Z%d", dst, dst)
	} else {
		p("VPMOVZXWD %s, Z%d", addr, dst)
	}
	p("VPSLLD $16, Z%d, Z%d", dst, dst)
}

var vecKinds = []vecKind{{"F32", 4, loadF32}, {"F16", 2, loadF16}, {"BF16", 2, loadBF16}}

func tailMask() {
	p("MOVL $1, AX")
	p("SHLL CX, AX")
	p("DECL AX")
	p("KMOVW AX, K1")
}

// dot: Σ a[i]·b[i], a float32, b of kind k.
func dot(k vecKind) {
	fmt.Fprintf(&b, "\n// func dot%sAVX512(a *float32, b unsafe.Pointer, n int) float32\n", k.name)
	fmt.Fprintf(&b, "TEXT ·dot%sAVX512(SB), NOSPLIT, $0-28\n", k.name)
	p("MOVQ a+0(FP), SI")
	p("MOVQ b+8(FP), DI")
	p("MOVQ n+16(FP), CX")
	for i := 0; i < 4; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	fmt.Fprintf(&b, "loop64:\n")
	p("CMPQ CX, $64")
	p("JLT loop16")
	for i := 0; i < 4; i++ {
		k.load(fmt.Sprintf("%d(DI)", 16*k.width*i), 4+i, false)
	}
	for i := 0; i < 4; i++ {
		p("VFMADD231PS %d(SI), Z%d, Z%d", 64*i, 4+i, i)
	}
	p("ADDQ $256, SI")
	p("ADDQ $%d, DI", 64*k.width)
	p("SUBQ $64, CX")
	p("JMP loop64")
	fmt.Fprintf(&b, "loop16:\n")
	p("CMPQ CX, $16")
	p("JLT tail")
	k.load("(DI)", 4, false)
	p("VFMADD231PS (SI), Z4, Z0")
	p("ADDQ $64, SI")
	p("ADDQ $%d, DI", 16*k.width)
	p("SUBQ $16, CX")
	p("JMP loop16")
	fmt.Fprintf(&b, "tail:\n")
	p("TESTQ CX, CX")
	p("JZ done")
	tailMask()
	k.load("(DI)", 4, true)
	p("VMOVUPS.Z (SI), K1, Z5")
	p("VFMADD231PS Z5, Z4, Z1")
	fmt.Fprintf(&b, "done:\n")
	p("VADDPS Z1, Z0, Z0")
	p("VADDPS Z3, Z2, Z2")
	p("VADDPS Z2, Z0, Z0")
	p("VEXTRACTF64X4 $1, Z0, Y1")
	p("VADDPS Y1, Y0, Y0")
	p("VEXTRACTF128 $1, Y0, X1")
	p("VADDPS X1, X0, X0")
	p("VPERMILPS $0x4e, X0, X1")
	p("VADDPS X1, X0, X0")
	p("VPERMILPS $0xb1, X0, X1")
	p("VADDSS X1, X0, X0")
	p("VZEROUPPER")
	p("MOVSS X0, ret+24(FP)")
	p("RET")
}

// axpy: out[i] += a·x[i], x of kind k.
func axpy(k vecKind) {
	fmt.Fprintf(&b, "\n// func axpy%sAVX512(out *float32, a float32, x unsafe.Pointer, n int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·axpy%sAVX512(SB), NOSPLIT, $0-32\n", k.name)
	p("MOVQ out+0(FP), DI")
	p("VBROADCASTSS a+8(FP), Z31")
	p("MOVQ x+16(FP), SI")
	p("MOVQ n+24(FP), CX")
	fmt.Fprintf(&b, "loop32:\n")
	p("CMPQ CX, $32")
	p("JLT loop16")
	k.load("(SI)", 4, false)
	k.load(fmt.Sprintf("%d(SI)", 16*k.width), 5, false)
	p("VFMADD213PS (DI), Z31, Z4")
	p("VFMADD213PS 64(DI), Z31, Z5")
	p("VMOVUPS Z4, (DI)")
	p("VMOVUPS Z5, 64(DI)")
	p("ADDQ $128, DI")
	p("ADDQ $%d, SI", 32*k.width)
	p("SUBQ $32, CX")
	p("JMP loop32")
	fmt.Fprintf(&b, "loop16:\n")
	p("CMPQ CX, $16")
	p("JLT tail")
	k.load("(SI)", 4, false)
	p("VFMADD213PS (DI), Z31, Z4")
	p("VMOVUPS Z4, (DI)")
	p("ADDQ $64, DI")
	p("ADDQ $%d, SI", 16*k.width)
	p("SUBQ $16, CX")
	p("JMP loop16")
	fmt.Fprintf(&b, "tail:\n")
	p("TESTQ CX, CX")
	p("JZ done")
	tailMask()
	k.load("(SI)", 4, true)
	p("VMOVUPS.Z (DI), K1, Z5")
	p("VFMADD213PS Z5, Z31, Z4")
	p("VMOVUPS Z4, K1, (DI)")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// q4sm: 4-bit nibbles (Q4C order), block 32, f32 S and M per row:
// acc += S·(dx·Σq·x) + M·sx.
func q4sm(name string, n int) {
	const blockBytes = 256 + 128
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	p("MOVL $0x0f0f0f0f, AX")
	p("VPBROADCASTD AX, Z27")
	fmt.Fprintf(&b, "loop:\n")
	prefetch(blockBytes)
	for k := 0; k < 4; k++ {
		p("VMOVDQU8 %d(DI), Z%d", 64*k, k+4)
		p("VPANDD Z27, Z%d, Z%d", k+4, k)
		p("VPSRLW $4, Z%d, Z%d", k+4, k+4)
		p("VPANDD Z27, Z%d, Z%d", k+4, k+4)
	}
	p("VMOVUPS 256(DI), Z24")
	p("VMOVUPS 320(DI), Z28")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	for k := 0; k < 8; k++ {
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 32*i+4*k, k, 8+i)
		}
	}
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Z%d, Z%d", 8+i, 8+i)
		p("VMULPS.BCST %d(DX), Z%d, Z%d", 8*i, 8+i, 8+i)
		p("VFMADD231PS Z%d, Z24, Z%d", 8+i, 16+i)
		p("VFMADD231PS.BCST %d(DX), Z28, Z%d", 8*i+4, 16+i)
	}
	p("ADDQ $%d, DI", blockBytes)
	p("ADDQ $%d, SI", 32*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ CX")
	p("JNZ loop")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// widen: dst[i] = float32(src[i]) for a half-precision kind.
func widen(k vecKind) {
	fmt.Fprintf(&b, "\n// func widen%sAVX512(dst *float32, src unsafe.Pointer, n int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·widen%sAVX512(SB), NOSPLIT, $0-24\n", k.name)
	p("MOVQ dst+0(FP), DI")
	p("MOVQ src+8(FP), SI")
	p("MOVQ n+16(FP), CX")
	fmt.Fprintf(&b, "loop32:\n")
	p("CMPQ CX, $32")
	p("JLT loop16")
	k.load("(SI)", 4, false)
	k.load("32(SI)", 5, false)
	p("VMOVUPS Z4, (DI)")
	p("VMOVUPS Z5, 64(DI)")
	p("ADDQ $128, DI")
	p("ADDQ $64, SI")
	p("SUBQ $32, CX")
	p("JMP loop32")
	fmt.Fprintf(&b, "loop16:\n")
	p("CMPQ CX, $16")
	p("JLT tail")
	k.load("(SI)", 4, false)
	p("VMOVUPS Z4, (DI)")
	p("ADDQ $64, DI")
	p("ADDQ $32, SI")
	p("SUBQ $16, CX")
	p("JMP loop16")
	fmt.Fprintf(&b, "tail:\n")
	p("TESTQ CX, CX")
	p("JZ done")
	tailMask()
	k.load("(SI)", 4, true)
	p("VMOVUPS Z4, K1, (DI)")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// narrowF16: dst[i] = f16(src[i]), round to nearest even (VCVTPS2PH $0).
func narrowF16() {
	fmt.Fprintf(&b, "\n// func narrowF16AVX512(dst unsafe.Pointer, src *float32, n int)\n")
	fmt.Fprintf(&b, "TEXT ·narrowF16AVX512(SB), NOSPLIT, $0-24\n")
	p("MOVQ dst+0(FP), DI")
	p("MOVQ src+8(FP), SI")
	p("MOVQ n+16(FP), CX")
	fmt.Fprintf(&b, "loop16:\n")
	p("CMPQ CX, $16")
	p("JLT tail")
	p("VMOVUPS (SI), Z4")
	p("VCVTPS2PH $0, Z4, (DI)")
	p("ADDQ $64, SI")
	p("ADDQ $32, DI")
	p("SUBQ $16, CX")
	p("JMP loop16")
	fmt.Fprintf(&b, "tail:\n")
	p("TESTQ CX, CX")
	p("JZ done")
	tailMask()
	p("VMOVUPS.Z (SI), K1, Z4")
	p("VCVTPS2PH $0, Z4, K1, (DI)")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// scores: s[t] = Σ_i q[i]·k_t[i] for n rows k_t = k + t·stride bytes, each
// of d elements of kind k.
func scores(k vecKind) {
	fmt.Fprintf(&b, "\n// func scores%sAVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·scores%sAVX512(SB), NOSPLIT, $0-48\n", k.name)
	p("MOVQ s+0(FP), R9")
	p("MOVQ q+8(FP), R10")
	p("MOVQ kr+16(FP), R11")
	p("MOVQ n+24(FP), R12")
	p("MOVQ d+32(FP), R13")
	p("MOVQ stride+40(FP), R8")
	// K1 = mask of the last d%16 lanes.
	p("MOVQ R13, CX")
	p("ANDQ $15, CX")
	tailMask()
	fmt.Fprintf(&b, "row:\n")
	p("TESTQ R12, R12")
	p("JZ done")
	p("MOVQ R10, SI")
	p("MOVQ R11, DI")
	p("MOVQ R13, CX")
	p("VPXORD Z0, Z0, Z0")
	p("VPXORD Z1, Z1, Z1")
	fmt.Fprintf(&b, "loop32:\n")
	p("CMPQ CX, $32")
	p("JLT loop16")
	k.load("(DI)", 4, false)
	k.load(fmt.Sprintf("%d(DI)", 16*k.width), 5, false)
	p("VFMADD231PS (SI), Z4, Z0")
	p("VFMADD231PS 64(SI), Z5, Z1")
	p("ADDQ $128, SI")
	p("ADDQ $%d, DI", 32*k.width)
	p("SUBQ $32, CX")
	p("JMP loop32")
	fmt.Fprintf(&b, "loop16:\n")
	p("CMPQ CX, $16")
	p("JLT tail")
	k.load("(DI)", 4, false)
	p("VFMADD231PS (SI), Z4, Z0")
	p("ADDQ $64, SI")
	p("ADDQ $%d, DI", 16*k.width)
	p("SUBQ $16, CX")
	fmt.Fprintf(&b, "tail:\n")
	p("TESTQ CX, CX")
	p("JZ sum")
	k.load("(DI)", 4, true)
	p("VMOVUPS.Z (SI), K1, Z5")
	p("VFMADD231PS Z5, Z4, Z1")
	fmt.Fprintf(&b, "sum:\n")
	p("VADDPS Z1, Z0, Z0")
	p("VEXTRACTF64X4 $1, Z0, Y1")
	p("VADDPS Y1, Y0, Y0")
	p("VEXTRACTF128 $1, Y0, X1")
	p("VADDPS X1, X0, X0")
	p("VPERMILPS $0x4e, X0, X1")
	p("VADDPS X1, X0, X0")
	p("VPERMILPS $0xb1, X0, X1")
	p("VADDSS X1, X0, X0")
	p("VMOVSS X0, (R9)")
	p("ADDQ $4, R9")
	p("ADDQ R8, R11")
	p("DECQ R12")
	p("JMP row")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// mix: out[i] += Σ_t w[t]·v_t[i] for n rows v_t = v + t·stride bytes of d
// elements; 16 output lanes at a time, kept in a register across the rows.
func mix(k vecKind) {
	fmt.Fprintf(&b, "\n// func mix%sAVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·mix%sAVX512(SB), NOSPLIT, $0-48\n", k.name)
	p("MOVQ out+0(FP), R9")
	p("MOVQ w+8(FP), R10")
	p("MOVQ v+16(FP), R11")
	p("MOVQ n+24(FP), R12")
	p("MOVQ d+32(FP), R13")
	p("MOVQ stride+40(FP), R8")
	p("MOVW $0xffff, AX")
	p("KMOVW AX, K1")
	fmt.Fprintf(&b, "chunk:\n")
	p("TESTQ R13, R13")
	p("JLE done")
	p("CMPQ R13, $16")
	p("JGE full")
	p("MOVQ R13, CX")
	tailMask()
	fmt.Fprintf(&b, "full:\n")
	p("VMOVUPS.Z (R9), K1, Z0")
	p("VPXORD Z1, Z1, Z1")
	p("MOVQ R10, SI")
	p("MOVQ R11, DI")
	p("MOVQ R12, CX")
	fmt.Fprintf(&b, "rows2:\n")
	p("CMPQ CX, $2")
	p("JLT rows1")
	k.load("(DI)", 4, true)
	p("ADDQ R8, DI")
	k.load("(DI)", 5, true)
	p("ADDQ R8, DI")
	p("VFMADD231PS.BCST (SI), Z4, Z0")
	p("VFMADD231PS.BCST 4(SI), Z5, Z1")
	p("ADDQ $8, SI")
	p("SUBQ $2, CX")
	p("JMP rows2")
	fmt.Fprintf(&b, "rows1:\n")
	p("TESTQ CX, CX")
	p("JZ store")
	k.load("(DI)", 4, true)
	p("VFMADD231PS.BCST (SI), Z4, Z0")
	fmt.Fprintf(&b, "store:\n")
	p("VADDPS Z1, Z0, Z0")
	p("VMOVUPS Z0, K1, (R9)")
	p("ADDQ $64, R9")
	p("ADDQ $%d, R11", 16*k.width)
	p("SUBQ $16, R13")
	p("JMP chunk")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// q4k: Q4_K in its own packed layout, per 16-row group and 256-column
// super-block: 16 f16 d, 16 f16 dmin, then 8 blocks of [256 B nibbles (Q4C
// order), 16 B 6-bit scales, 16 B 6-bit minima], one byte per row each.
// Per block S = d·sc and M = dmin·m are formed in float32 (exact, as in
// packQ4SM). The activations' scale dx is the same over a super-block
// (Q8_K), so the scale terms gather unscaled, a += S·Σq·x, and dx joins
// once a super-block, acc += dx·a − Σ M·sx: two float operations per
// block and row of activations beside its 8 VPDPBUSD, not three, on the
// pipes the VPDPBUSD need.
//
// Registers: Z0..Z3 one half-block's nibbles (the high half re-read and
// shifted from memory, so four suffice), Z8.. integer sums, Z16.. the
// accumulators, a in Z4..Z7, Z25, Z26, Z27, Z31 (the nibble mask comes
// from memory), Z24 S, Z28 M, Z29 d, Z30 dmin. Every row count takes this
// form, one row (decode) too: a row's arithmetic must not depend on how
// many rows share the call, or a prefill would differ from the same
// tokens decoded one by one.
func q4k(name string, n int) { q45kScaled(name, n, false) }

// q5k: Q5_K as q4k plus a 64-byte fifth-bit plane after each block's
// nibbles (as in q5c): [256 B nibbles, 64 B plane, 16 B scales, 16 B
// minima] per block, 0.70 B/weight. Z24 and Z28 shift the plane before
// S and M take them, after the products.
func q5k(name string, n int) { q45kScaled(name, n, true) }

func q45kScaled(name string, n int, plane bool) {
	blockBytes, scOff := 288, 256
	if plane {
		blockBytes, scOff = 352, 320
	}
	ua := []int{4, 5, 6, 7, 25, 26, 27, 31}
	if n <= fewRows {
		ua = []int{20, 21, 22, 23}
	}
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nsb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	fmt.Fprintf(&b, "super:\n")
	p("VCVTPH2PS (DI), Z29")
	p("VCVTPH2PS 32(DI), Z30")
	p("ADDQ $64, DI")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", ua[i], ua[i], ua[i])
	}
	p("MOVQ $8, R10")
	fmt.Fprintf(&b, "loop:\n")
	prefetch(blockBytes)
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	if n <= fewRows {
		q45kProductsFew(n, plane)
	} else {
		q45kProducts(n, plane)
	}
	p("VPMOVZXBD %d(DI), Z24", scOff)
	p("VCVTDQ2PS Z24, Z24")
	p("VMULPS Z29, Z24, Z24")
	p("VPMOVZXBD %d(DI), Z28", scOff+16)
	p("VCVTDQ2PS Z28, Z28")
	p("VMULPS Z30, Z28, Z28")
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Z%d, Z%d", 8+i, 8+i)
		p("VFMADD231PS Z%d, Z24, Z%d", 8+i, ua[i])
		p("VFNMADD231PS.BCST %d(DX), Z28, Z%d", 8*i+4, 16+i)
	}
	p("ADDQ $%d, DI", blockBytes)
	p("ADDQ $%d, SI", 32*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ R10")
	p("JNZ loop")
	// dx of the super-block: that of its last block, just passed.
	for i := 0; i < n; i++ {
		p("VFMADD231PS.BCST %d(DX), Z%d, Z%d", 8*i-8*n, ua[i], 16+i)
	}
	p("DECQ CX")
	p("JNZ super")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// fewRows is the most rows of activations for which the K-quant kernels
// keep a block's weights in registers (the arithmetic is the same either
// way: only where the values live changes, so every row count gives a
// row the same bits); above it the registers hold the sums.
const fewRows = 4

// q45kProducts builds a block's values half by half in Z0..Z3 (the high
// nibbles re-read and shifted from L1, the fifth-bit plane shifted into
// Z24) and runs its products into Z8...
func q45kProducts(n int, plane bool) {
	for k := 0; k < 8; k++ {
		if k%4 == 0 {
			for j := 0; j < 4; j++ {
				if k == 0 {
					p("VMOVDQU8 %d(DI), Z%d", 64*j, j)
				} else {
					p("VPSRLW $4, %d(DI), Z%d", 64*j, j)
				}
				p("VPANDD.BCST nibmask<>(SB), Z%d, Z%d", j, j)
				if !plane {
					continue
				}
				// value |= fifth bit of column 4·(k+j)… moved to bit 4
				switch sh := k + j - 4; {
				case sh < 0:
					p("VPSLLW $%d, 256(DI), Z24", -sh)
				case sh == 0:
					p("VMOVDQU8 256(DI), Z24")
				default:
					p("VPSRLW $%d, 256(DI), Z24", sh)
				}
				p("VPTERNLOGD.BCST $0xf8, bit4mask<>(SB), Z24, Z%d", j)
			}
		}
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 32*i+4*k, k%4, 8+i)
		}
	}
}

// q45kProductsFew is q45kProducts with the block's eight values in
// Z0..Z7 at once, from registers: fewer loads where few rows share them.
func q45kProductsFew(n int, plane bool) {
	for k := 0; k < 4; k++ {
		p("VMOVDQU8 %d(DI), Z%d", 64*k, k+4)
		p("VPANDD.BCST nibmask<>(SB), Z%d, Z%d", k+4, k)
		p("VPSRLW $4, Z%d, Z%d", k+4, k+4)
		p("VPANDD.BCST nibmask<>(SB), Z%d, Z%d", k+4, k+4)
	}
	if plane {
		p("VMOVDQU8 256(DI), Z28")
		for k := 0; k < 8; k++ {
			src := 31
			switch sh := k - 4; {
			case sh < 0:
				p("VPSLLW $%d, Z28, Z31", -sh)
			case sh == 0:
				src = 28
			default:
				p("VPSRLW $%d, Z28, Z31", sh)
			}
			p("VPTERNLOGD.BCST $0xf8, bit4mask<>(SB), Z%d, Z%d", src, k)
		}
	}
	if n == 1 {
		// Two chains of four, not one of eight (exact integer sums).
		p("VPXORD Z12, Z12, Z12")
		for k := 0; k < 8; k++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 4*k, k, 8+4*(k%2))
		}
		p("VPADDD Z12, Z8, Z8")
		return
	}
	for k := 0; k < 8; k++ {
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 32*i+4*k, k, 8+i)
		}
	}
}

// q6k: Q6_K in its own packed layout, per 16-row group and 256-column
// super-block: 16 f16 d, then 16 blocks of 16 columns, each [128 B low
// nibbles (chunks 0|2, then 1|3), 64 B high bit pairs (chunk k at bits
// 2k..2k+1), 16 B int8 scales]: 0.82 B/weight, as Q6_K itself.
// acc += dx·Σ_b d·sc_b·(Σq·x − 32·Σx): the activations (Q8_K, packed
// with nodx) give 32·Σx unscaled, so a block costs one FMA per row of
// activations on the VNNI pipes (the subtraction and conversion go
// elsewhere) and dx joins once a super-block, as in q4k. The masks come
// from memory and Z24 shifts the high bits before it holds d·sc, which
// leaves room for the unscaled sums in Z4..Z7, Z25..Z28.
func q6k(name string, n int) {
	ua := []int{4, 5, 6, 7, 25, 26, 27, 28}
	if n <= fewRows {
		ua = []int{20, 21, 22, 23}
	}
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nsb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	fmt.Fprintf(&b, "super:\n")
	p("VCVTPH2PS (DI), Z29")
	p("ADDQ $32, DI")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", ua[i], ua[i], ua[i])
	}
	p("MOVQ $16, R10")
	fmt.Fprintf(&b, "loop:\n")
	prefetch(208)
	if n <= fewRows {
		q6kValuesFew()
	} else {
		q6kValues()
	}
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	if n == 1 {
		// Two chains of two, not one of four: one row has nothing else
		// to overlap them with. The integer sums are exact either way.
		p("VPXORD Z12, Z12, Z12")
		for k := 0; k < 4; k++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 4*k, k, 8+4*(k%2))
		}
		p("VPADDD Z12, Z8, Z8")
	} else {
		for k := 0; k < 4; k++ {
			for i := 0; i < n; i++ {
				p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 16*i+4*k, k, 8+i)
			}
		}
	}
	p("VPMOVSXBD 192(DI), Z24")
	p("VCVTDQ2PS Z24, Z24")
	p("VMULPS Z29, Z24, Z24")
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Z%d, Z%d", 8+i, 8+i)
		p("VSUBPS.BCST %d(DX), Z%d, Z%d", 8*i+4, 8+i, 8+i)
		p("VFMADD231PS Z%d, Z24, Z%d", 8+i, ua[i])
	}
	p("ADDQ $208, DI")
	p("ADDQ $%d, SI", 16*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ R10")
	p("JNZ loop")
	// dx of the super-block: that of its last block, just passed.
	for i := 0; i < n; i++ {
		p("VFMADD231PS.BCST %d(DX), Z%d, Z%d", 8*i-8*n, ua[i], 16+i)
	}
	p("DECQ CX")
	p("JNZ super")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// q6kValues builds a block's four 6-bit values in Z0..Z3 from memory
// (Z24 the only temporary), for q6k with many rows.
func q6kValues() {
	for j := 0; j < 2; j++ {
		p("VMOVDQU8 %d(DI), Z%d", 64*j, j)
		p("VPANDD.BCST nibmask<>(SB), Z%d, Z%d", j, j)
		p("VPSRLW $4, %d(DI), Z%d", 64*j, j+2)
		p("VPANDD.BCST nibmask<>(SB), Z%d, Z%d", j+2, j+2)
	}
	// chunk |= (high bits moved to bits 4-5) & 0x30
	for k, sh := range []int{4, 2, 0, -2} {
		switch {
		case sh > 0:
			p("VPSLLW $%d, 128(DI), Z24", sh)
		case sh == 0:
			p("VMOVDQU8 128(DI), Z24")
		default:
			p("VPSRLW $%d, 128(DI), Z24", -sh)
		}
		p("VPTERNLOGD.BCST $0xf8, bits45mask<>(SB), Z24, Z%d", k)
	}
}

// q6kValuesFew is q6kValues from registers: each 64 bytes loaded once.
func q6kValuesFew() {
	p("VMOVDQU8 (DI), Z4")
	p("VPANDD.BCST nibmask<>(SB), Z4, Z0")
	p("VPSRLW $4, Z4, Z4")
	p("VPANDD.BCST nibmask<>(SB), Z4, Z2")
	p("VMOVDQU8 64(DI), Z5")
	p("VPANDD.BCST nibmask<>(SB), Z5, Z1")
	p("VPSRLW $4, Z5, Z5")
	p("VPANDD.BCST nibmask<>(SB), Z5, Z3")
	p("VMOVDQU8 128(DI), Z6")
	for k, sh := range []int{4, 2, 0, -2} {
		src := 7
		switch {
		case sh > 0:
			p("VPSLLW $%d, Z6, Z7", sh)
		case sh == 0:
			src = 6
		default:
			p("VPSRLW $%d, Z6, Z7", -sh)
		}
		p("VPTERNLOGD.BCST $0xf8, bits45mask<>(SB), Z%d, Z%d", src, k)
	}
}

// q5c: Q5_0 packed: per 16-row group and 32-column block, [256 B low
// nibbles as packQ4C, 64 B high-bit plane (byte (r, j) bit k = fifth bit of
// column 4k+j), 32 B f16 d]: 0.69 B/weight like Q5_0. acc += d·(dx·Σq·x −
// 16·dx·Σx).
func q5c(name string, n int) {
	fmt.Fprintf(&b, "\n// func %s%d(w *byte, x *int8, st *float32, out *float32, nb, os int)\n", name, n)
	fmt.Fprintf(&b, "TEXT ·%s%d(SB), NOSPLIT, $0-48\n", name, n)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R9")
	p("MOVQ nb+32(FP), CX")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 16+i, 16+i, 16+i)
	}
	p("MOVL $0x0f0f0f0f, AX")
	p("VPBROADCASTD AX, Z27")
	p("MOVL $0x10101010, AX")
	p("VPBROADCASTD AX, Z26")
	fmt.Fprintf(&b, "loop:\n")
	prefetch(352)
	for k := 0; k < 4; k++ {
		p("VMOVDQU8 %d(DI), Z%d", 64*k, k+4)
		p("VPANDD Z27, Z%d, Z%d", k+4, k)
		p("VPSRLW $4, Z%d, Z%d", k+4, k+4)
		p("VPANDD Z27, Z%d, Z%d", k+4, k+4)
	}
	p("VMOVDQU8 256(DI), Z28")
	for k := 0; k < 8; k++ {
		switch {
		case k < 4:
			p("VPSLLW $%d, Z28, Z29", 4-k)
			p("VPTERNLOGD $0xf8, Z26, Z29, Z%d", k)
		case k == 4:
			p("VPTERNLOGD $0xf8, Z26, Z28, Z%d", k)
		default:
			p("VPSRLW $%d, Z28, Z29", k-4)
			p("VPTERNLOGD $0xf8, Z26, Z29, Z%d", k)
		}
	}
	p("VCVTPH2PS 320(DI), Z24")
	for i := 0; i < n; i++ {
		p("VPXORD Z%d, Z%d, Z%d", 8+i, 8+i, 8+i)
	}
	for k := 0; k < 8; k++ {
		for i := 0; i < n; i++ {
			p("VPDPBUSD.BCST %d(SI), Z%d, Z%d", 32*i+4*k, k, 8+i)
		}
	}
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Z%d, Z%d", 8+i, 8+i)
		p("VBROADCASTSS %d(DX), Z25", 8*i)
		p("VFMSUB213PS.BCST %d(DX), Z25, Z%d", 8*i+4, 8+i)
		p("VFMADD231PS Z%d, Z24, Z%d", 8+i, 16+i)
	}
	p("ADDQ $352, DI")
	p("ADDQ $%d, SI", 32*n)
	p("ADDQ $%d, DX", 8*n)
	p("DECQ CX")
	p("JNZ loop")
	storeRows(n)
	p("VZEROUPPER")
	p("RET")
}

// scores4: the scores of four query vectors (a GQA group's heads) against
// the same n rows: s[j·ss+t] = Σ_i q_j[i]·k_t[i] for j < 4, q_j at q+j·d
// floats, ss in bytes. Each row is read and widened once for the four
// heads, and the four sums are reduced together (two lane shuffles and a
// within-lane tree) rather than one horizontal sum per score. d is a
// positive multiple of 16.
func scores4(k vecKind) {
	fmt.Fprintf(&b, "\n// func scores4%sAVX512(s *float32, q *float32, kr unsafe.Pointer, n, d, stride, ss int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·scores4%sAVX512(SB), NOSPLIT, $0-56\n", k.name)
	p("MOVQ s+0(FP), R9")
	p("MOVQ q+8(FP), R10")
	p("MOVQ kr+16(FP), R11")
	p("MOVQ n+24(FP), R12")
	p("MOVQ d+32(FP), R13")
	p("MOVQ stride+40(FP), R8")
	p("MOVQ ss+48(FP), BX")
	p("LEAQ (BX)(BX*2), DX")
	p("MOVQ R13, R14")
	p("SHLQ $2, R14")
	p("LEAQ (R14)(R14*2), AX")
	fmt.Fprintf(&b, "row:\n")
	p("MOVQ R10, SI")
	p("MOVQ R11, DI")
	p("MOVQ R13, CX")
	for i := 0; i < 4; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	fmt.Fprintf(&b, "loop:\n")
	k.load("(DI)", 8, false)
	p("VFMADD231PS (SI), Z8, Z0")
	p("VFMADD231PS (SI)(R14*1), Z8, Z1")
	p("VFMADD231PS (SI)(R14*2), Z8, Z2")
	p("VFMADD231PS (SI)(AX*1), Z8, Z3")
	p("ADDQ $64, SI")
	p("ADDQ $%d, DI", 16*k.width)
	p("SUBQ $16, CX")
	p("JNZ loop")
	// Z4 = [a halves summed | b halves summed], Z6 likewise c, d.
	p("VSHUFF64X2 $0x44, Z1, Z0, Z4")
	p("VSHUFF64X2 $0xee, Z1, Z0, Z5")
	p("VADDPS Z5, Z4, Z4")
	p("VSHUFF64X2 $0x44, Z3, Z2, Z6")
	p("VSHUFF64X2 $0xee, Z3, Z2, Z7")
	p("VADDPS Z7, Z6, Z6")
	// 128-bit lane j of Z5 holds four partial sums of head j.
	p("VSHUFF32X4 $0x88, Z6, Z4, Z5")
	p("VSHUFF32X4 $0xdd, Z6, Z4, Z7")
	p("VADDPS Z7, Z5, Z5")
	p("VPERMILPS $0x4e, Z5, Z6")
	p("VADDPS Z6, Z5, Z5")
	p("VPERMILPS $0xb1, Z5, Z6")
	p("VADDPS Z6, Z5, Z5")
	p("VMOVSS X5, (R9)")
	p("VEXTRACTF32X4 $1, Z5, X6")
	p("VMOVSS X6, (R9)(BX*1)")
	p("VEXTRACTF32X4 $2, Z5, X6")
	p("VMOVSS X6, (R9)(BX*2)")
	p("VEXTRACTF32X4 $3, Z5, X6")
	p("VMOVSS X6, (R9)(DX*1)")
	p("ADDQ $4, R9")
	p("ADDQ R8, R11")
	p("DECQ R12")
	p("JNZ row")
	p("VZEROUPPER")
	p("RET")
}

// Tiled attention (attntile.go). A page's keys, transposed per tile of 16
// slots (tileK), make a score a sum along lanes: for each of the d
// elements one load of 16 slots' values and one broadcast FMA per query
// head, no horizontal reduction at all. The transposition costs about as
// much as the reductions it removes for one query, and is done once per
// page for all the queries of a call.

// headAddr is the address of the vector of head h: heads 0..3 from base,
// 4..7 from base4 (base + 4·step), step and 3·step in registers.
func headAddr(h int, base, base4, step, step3 string) string {
	b := base
	if h >= 4 {
		b = base4
	}
	switch h % 4 {
	case 0:
		return "(" + b + ")"
	case 1:
		return "(" + b + ")(" + step + "*1)"
	case 2:
		return "(" + b + ")(" + step + "*2)"
	}
	return "(" + b + ")(" + step3 + "*1)"
}

// tileK: kt[(c·16+i)·16 + t] = k_t[c·16+i] for the 16 rows t of one tile
// (row t at kr + t·stride bytes) and every column block c of d: each
// 16×16 block is widened into Z0..Z15 and transposed in four rounds of
// shuffles (pairs of floats, pairs of pairs, then 128-bit lanes twice).
func tileK(k vecKind) {
	fmt.Fprintf(&b, "\n// func tileK%sAVX512(kt *float32, kr unsafe.Pointer, stride, d int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·tileK%sAVX512(SB), NOSPLIT, $0-32\n", k.name)
	p("MOVQ kt+0(FP), R9")
	p("MOVQ kr+8(FP), R11")
	p("MOVQ stride+16(FP), R8")
	p("MOVQ d+24(FP), CX")
	fmt.Fprintf(&b, "block:\n")
	p("MOVQ R11, DI")
	for i := 0; i < 16; i++ {
		k.load("(DI)", i, false)
		if i < 15 {
			p("ADDQ R8, DI")
		}
	}
	for i := 0; i < 16; i += 2 {
		p("VUNPCKLPS Z%d, Z%d, Z%d", i+1, i, 16+i)
		p("VUNPCKHPS Z%d, Z%d, Z%d", i+1, i, 17+i)
	}
	for i := 0; i < 16; i += 4 {
		p("VUNPCKLPD Z%d, Z%d, Z%d", 18+i, 16+i, i)
		p("VUNPCKHPD Z%d, Z%d, Z%d", 18+i, 16+i, i+1)
		p("VUNPCKLPD Z%d, Z%d, Z%d", 19+i, 17+i, i+2)
		p("VUNPCKHPD Z%d, Z%d, Z%d", 19+i, 17+i, i+3)
	}
	// Z(c), Z(4+c), Z(8+c), Z(12+c): lane L holds rows 0-3, 4-7, 8-11,
	// 12-15 of column 4L+c.
	for c := 0; c < 4; c++ {
		p("VSHUFF32X4 $0x44, Z%d, Z%d, Z16", 4+c, c)
		p("VSHUFF32X4 $0xee, Z%d, Z%d, Z17", 4+c, c)
		p("VSHUFF32X4 $0x44, Z%d, Z%d, Z18", 12+c, 8+c)
		p("VSHUFF32X4 $0xee, Z%d, Z%d, Z19", 12+c, 8+c)
		p("VSHUFF32X4 $0x88, Z18, Z16, Z20")
		p("VSHUFF32X4 $0xdd, Z18, Z16, Z21")
		p("VSHUFF32X4 $0x88, Z19, Z17, Z22")
		p("VSHUFF32X4 $0xdd, Z19, Z17, Z23")
		for L := 0; L < 4; L++ {
			p("VMOVUPS Z%d, %d(R9)", 20+L, 64*(4*L+c))
		}
	}
	p("ADDQ $1024, R9")
	p("ADDQ $%d, R11", 16*k.width)
	p("SUBQ $16, CX")
	p("JNZ block")
	p("VZEROUPPER")
	p("RET")
}

// scoresTile: s_j[t] = q_j·k_t for n ≤ 8 query heads j and the 16 slots t
// of one tile (tileK's layout), stored under a lane mask: s_j at
// s + off + j·ss bytes, q_j at q + j·qs bytes. Each head sums its even
// and odd elements in two accumulators (at least four FMA chains in
// flight for one head), added at the end: a head's arithmetic is the same
// whatever n, so a GQA group split over tensor-parallel ranks scores as
// it does whole. d is a positive multiple of 16.
func scoresTile(n int) {
	fmt.Fprintf(&b, "\n// func scoresTile%dAVX512(s *float32, off, ss int, q *float32, qs int, kt *float32, d, mask int)\n", n)
	fmt.Fprintf(&b, "TEXT ·scoresTile%dAVX512(SB), NOSPLIT, $0-64\n", n)
	p("MOVQ s+0(FP), R9")
	p("ADDQ off+8(FP), R9")
	p("MOVQ ss+16(FP), BX")
	p("MOVQ q+24(FP), SI")
	p("MOVQ qs+32(FP), R8")
	p("MOVQ kt+40(FP), DI")
	p("MOVQ d+48(FP), CX")
	p("LEAQ (R8)(R8*2), AX")
	p("LEAQ (SI)(R8*4), R12")
	split := true
	for h := 0; h < n; h++ {
		p("VPXORD Z%d, Z%d, Z%d", h, h, h)
		if split {
			p("VPXORD Z%d, Z%d, Z%d", 8+h, 8+h, 8+h)
		}
	}
	fmt.Fprintf(&b, "loop:\n")
	p("VMOVUPS (DI), Z16")
	p("VMOVUPS 64(DI), Z17")
	for h := 0; h < n; h++ {
		p("VFMADD231PS.BCST %s, Z16, Z%d", headAddr(h, "SI", "R12", "R8", "AX"), h)
	}
	for h := 0; h < n; h++ {
		acc := h
		if split {
			acc = 8 + h
		}
		p("VFMADD231PS.BCST 4%s, Z17, Z%d", headAddr(h, "SI", "R12", "R8", "AX"), acc)
	}
	p("ADDQ $8, SI")
	if n > 4 {
		p("ADDQ $8, R12")
	}
	p("ADDQ $128, DI")
	p("SUBQ $2, CX")
	p("JNZ loop")
	if split {
		for h := 0; h < n; h++ {
			p("VADDPS Z%d, Z%d, Z%d", 8+h, h, h)
		}
	}
	p("MOVQ mask+56(FP), CX")
	p("KMOVW CX, K1")
	p("LEAQ (BX)(BX*2), DX")
	p("LEAQ (R9)(BX*4), R15")
	for h := 0; h < n; h++ {
		p("VMOVUPS Z%d, K1, %s", h, headAddr(h, "R9", "R15", "BX", "DX"))
	}
	p("VZEROUPPER")
	p("RET")
}

// mixN: out_j[i] += Σ_t w_j[t]·v_t[i] for n ≤ 8 heads j, out_j at
// out + j·d floats, w_j at w + j·ws bytes: each 16-lane chunk of a row is
// widened once for all n heads, their sums held in registers across the
// rows. A head's arithmetic is the same whatever n, so a GQA group mixes
// the same split over tensor-parallel ranks as whole. d is a positive
// multiple of 16. (mix4 is n = 4, the four-head kernel of heads4.)
func mixN(k vecKind, n int) {
	fmt.Fprintf(&b, "\n// func mix%d%sAVX512(out *float32, w *float32, v unsafe.Pointer, n, d, stride, ws int)\n", n, k.name)
	fmt.Fprintf(&b, "TEXT ·mix%d%sAVX512(SB), NOSPLIT, $0-56\n", n, k.name)
	p("MOVQ out+0(FP), R9")
	p("MOVQ w+8(FP), R10")
	p("MOVQ v+16(FP), R11")
	p("MOVQ d+32(FP), R13")
	p("MOVQ stride+40(FP), R8")
	p("MOVQ ws+48(FP), BX")
	p("LEAQ (BX)(BX*2), DX")
	p("MOVQ R13, R14")
	p("SHLQ $2, R14")
	p("LEAQ (R14)(R14*2), AX")
	p("LEAQ (R9)(R14*4), R15")
	fmt.Fprintf(&b, "chunk:\n")
	for h := 0; h < n; h++ {
		p("VMOVUPS %s, Z%d", headAddr(h, "R9", "R15", "R14", "AX"), h)
	}
	p("MOVQ R10, SI")
	if n > 4 {
		p("LEAQ (SI)(BX*4), R12")
	}
	p("MOVQ R11, DI")
	p("MOVQ n+24(FP), CX")
	fmt.Fprintf(&b, "rows:\n")
	k.load("(DI)", 8, false)
	for h := 0; h < n; h++ {
		p("VFMADD231PS.BCST %s, Z8, Z%d", headAddr(h, "SI", "R12", "BX", "DX"), h)
	}
	p("ADDQ $4, SI")
	if n > 4 {
		p("ADDQ $4, R12")
	}
	p("ADDQ R8, DI")
	p("DECQ CX")
	p("JNZ rows")
	for h := 0; h < n; h++ {
		p("VMOVUPS Z%d, %s", h, headAddr(h, "R9", "R15", "R14", "AX"))
	}
	p("ADDQ $64, R9")
	p("ADDQ $64, R15")
	p("ADDQ $%d, R11", 16*k.width)
	p("SUBQ $16, R13")
	p("JNZ chunk")
	p("VZEROUPPER")
	p("RET")
}

func vecMain() {
	b.Reset()
	b.WriteString("// Code generated by gen_asm.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	for _, k := range vecKinds {
		dot(k)
		axpy(k)
		if k.width == 2 {
			widen(k)
		}
	}
	narrowF16()
	for _, k := range vecKinds {
		scores(k)
		mix(k)
	}
	for _, k := range vecKinds {
		scores4(k)
		mixN(k, 4)
	}
	for _, k := range vecKinds {
		tileK(k)
		for n := 1; n <= 8; n++ {
			if n != 4 {
				mixN(k, n)
			}
		}
	}
	for n := 1; n <= 8; n++ {
		scoresTile(n)
	}
	if err := os.WriteFile("vec_amd64.s", b.Bytes(), 0o644); err != nil {
		panic(err)
	}
}

func main() {
	vecMain()
	b.Reset()
	b.WriteString("// Code generated by gen_asm.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	b.WriteString("\nDATA nibmask<>+0(SB)/4, $0x0f0f0f0f\nGLOBL nibmask<>(SB), RODATA|NOPTR, $4\nDATA bit4mask<>+0(SB)/4, $0x10101010\nGLOBL bit4mask<>(SB), RODATA|NOPTR, $4\nDATA bits45mask<>+0(SB)/4, $0x30303030\nGLOBL bits45mask<>(SB), RODATA|NOPTR, $4\n")
	for n := 1; n <= 8; n++ {
		constK("gemmQ8C", false, 8, false, n)
	}
	for n := 1; n <= 8; n++ {
		constK("gemmQ4C", true, 8, false, n)
	}
	for n := 1; n <= 8; n++ {
		constK("gemmQ8S16_", false, 4, true, n)
	}
	for n := 1; n <= 8; n++ {
		sm16("gemmSM16_", n)
	}
	for n := 1; n <= 8; n++ {
		q4sm("gemmQ4SM", n)
	}
	for n := 1; n <= 8; n++ {
		q4k("gemmQ4K", n)
	}
	for n := 1; n <= 8; n++ {
		q6k("gemmQ6K", n)
	}
	for n := 1; n <= 8; n++ {
		q5c("gemmQ5C", n)
	}
	for n := 1; n <= 8; n++ {
		q5k("gemmQ5K", n)
	}
	for _, wt := range []string{"F32", "F16", "BF16"} {
		for n := 1; n <= 4; n++ {
			floatGemm(wt, n)
		}
	}
	if err := os.WriteFile("matmul_amd64.s", b.Bytes(), 0o644); err != nil {
		panic(err)
	}
	var g bytes.Buffer
	g.WriteString("// Code generated by gen_asm.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage kernels\n\n")
	for _, name := range []string{"gemmQ8C", "gemmQ4C", "gemmSM16_", "gemmQ4SM", "gemmQ8S16_", "gemmQ4K", "gemmQ6K", "gemmQ5C", "gemmQ5K"} {
		for n := 1; n <= 8; n++ {
			fmt.Fprintf(&g, "//go:noescape\nfunc %s%d(w *byte, x *int8, st *float32, out *float32, nb, os int)\n\n", name, n)
		}
		fmt.Fprintf(&g, "var %sFns = [9]gemmKernel{nil", name)
		for n := 1; n <= 8; n++ {
			fmt.Fprintf(&g, ", %s%d", name, n)
		}
		g.WriteString("}\n\n")
	}
	for _, wt := range []string{"F32", "F16", "BF16"} {
		for n := 1; n <= 4; n++ {
			fmt.Fprintf(&g, "//go:noescape\nfunc gemm%s_4x%d(w *byte, ws int, x *float32, xs int, nblk int, out *float32)\n\n", wt, n)
		}
		fmt.Fprintf(&g, "var gemm%sFns = [5]floatKernel{nil", wt)
		for n := 1; n <= 4; n++ {
			fmt.Fprintf(&g, ", gemm%s_4x%d", wt, n)
		}
		g.WriteString("}\n\n")
	}
	src, err := format.Source(g.Bytes())
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile("matmul_stubs_amd64.go", src, 0o644); err != nil {
		panic(err)
	}
}
