//go:build ignore

// gen_avx2 writes avx2_amd64.s: AVX2+FMA+F16C kernels for CPUs without
// AVX-512 VNNI. The integer kernels read the same packed layouts as the
// AVX-512 ones, one 8-row half of a 16-row group at a time, with
// VPMADDUBSW+VPMADDWD in place of VPDPBUSD.
//
//	go run gen_avx2.go
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"os"
)

var b bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }

type intKind struct {
	name       string
	chunks     int  // 4-byte column chunks per block
	nibble     bool // 4-bit values, chunk k low nibbles, k+chunks/2 high
	f32scale   bool
	mode       string // "sign" (signed 8-bit, no offset), "constk", "sm"
	blockBytes int
}

var intKinds = []intKind{
	{"Q8C", 8, false, false, "sign", 544},
	{"Q4C", 8, true, false, "constk", 288},
	{"Q8S16", 4, false, true, "constk", 320},
	{"Q4SM", 8, true, true, "sm", 384},
	{"SM16", 4, false, true, "sm", 384},
}

// Registers: Y0..Y3 integer sums, Y4..Y7 float accumulators, Y8 scale,
// Y9 offset (sm), Y10..Y13 temporaries, Y14 mask, Y15 int16 ones.
func intKernel(k intKind, n int) {
	name := fmt.Sprintf("gemm%s_avx2_%d", k.name, n)
	wbytes := 64 * k.chunks
	if k.nibble {
		wbytes /= 2
	}
	fmt.Fprintf(&b, "\n// func %s(w *byte, x *int8, st *float32, out *float32, nb, half, xs, ss int)\n", name)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-64\n", name)
	p("MOVQ w+0(FP), DI")
	p("MOVQ x+8(FP), SI")
	p("MOVQ st+16(FP), DX")
	p("MOVQ out+24(FP), R12")
	p("MOVQ nb+32(FP), CX")
	p("MOVQ half+40(FP), R10")
	p("MOVQ xs+48(FP), R8")
	p("MOVQ ss+56(FP), R9")
	p("MOVQ R10, R11")
	p("SHLQ $5, R10")
	if k.f32scale {
		p("SHLQ $5, R11")
	} else {
		p("SHLQ $4, R11")
	}
	p("MOVL $0x00010001, BX")
	p("VMOVD BX, X15")
	p("VPBROADCASTD X15, Y15")
	if k.nibble {
		p("MOVL $0x0f0f0f0f, BX")
	} else {
		p("MOVL $0x80808080, BX")
	}
	p("VMOVD BX, X14")
	p("VPBROADCASTD X14, Y14")
	for i := 0; i < n; i++ {
		p("VPXOR Y%d, Y%d, Y%d", 4+i, 4+i, 4+i)
	}
	fmt.Fprintf(&b, "loop:\n")
	for i := 0; i < n; i++ {
		p("VPXOR Y%d, Y%d, Y%d", i, i, i)
	}
	rowBytes := 4 * k.chunks // activation bytes per row per block
	dotChunk := func(wreg, chunk int) {
		for i := 0; i < n; i++ {
			p("VPBROADCASTD %d(SI), Y12", rowBytes*i+4*chunk)
			if k.mode == "sign" {
				p("VPSIGNB Y13, Y12, Y12")
			}
			p("VPMADDUBSW Y12, Y%d, Y11", wreg)
			p("VPMADDWD Y15, Y11, Y11")
			p("VPADDD Y11, Y%d, Y%d", i, i)
		}
	}
	if k.nibble {
		for c := 0; c < k.chunks/2; c++ {
			p("VMOVDQU %d(DI)(R10*1), Y13", 64*c)
			p("VPSRLW $4, Y13, Y10")
			p("VPAND Y14, Y10, Y10")
			p("VPAND Y14, Y13, Y13")
			dotChunk(13, c)
			dotChunk(10, c+k.chunks/2)
		}
	} else {
		for c := 0; c < k.chunks; c++ {
			p("VMOVDQU %d(DI)(R10*1), Y13", 64*c)
			if k.mode == "sign" {
				p("VPXOR Y14, Y13, Y13")
				p("VPABSB Y13, Y10")
				dotChunk(10, c)
			} else {
				dotChunk(13, c)
			}
		}
	}
	if k.f32scale {
		p("VMOVUPS %d(DI)(R11*1), Y8", wbytes)
	} else {
		p("VCVTPH2PS %d(DI)(R11*1), Y8", wbytes)
	}
	if k.mode == "sm" {
		p("VMOVUPS %d(DI)(R11*1), Y9", wbytes+64)
	}
	for i := 0; i < n; i++ {
		p("VCVTDQ2PS Y%d, Y%d", i, i)
		p("VBROADCASTSS %d(DX), Y10", 8*i)
		switch k.mode {
		case "constk":
			p("VBROADCASTSS %d(DX), Y11", 8*i+4)
			p("VFMSUB213PS Y11, Y10, Y%d", i)
			p("VFMADD231PS Y%d, Y8, Y%d", i, 4+i)
		case "sign":
			p("VMULPS Y10, Y%d, Y%d", i, i)
			p("VFMADD231PS Y%d, Y8, Y%d", i, 4+i)
		case "sm":
			p("VMULPS Y10, Y%d, Y%d", i, i)
			p("VFMADD231PS Y%d, Y8, Y%d", i, 4+i)
			p("VBROADCASTSS %d(DX), Y11", 8*i+4)
			p("VFMADD231PS Y11, Y9, Y%d", 4+i)
		}
	}
	p("ADDQ $%d, DI", k.blockBytes)
	p("ADDQ R8, SI")
	p("ADDQ R9, DX")
	p("DECQ CX")
	p("JNZ loop")
	for i := 0; i < n; i++ {
		p("VMOVUPS Y%d, %d(R12)", 4+i, 64*i)
	}
	p("VZEROUPPER")
	p("RET")
}

// Float kernels, 8 lanes; callers handle n%8 (vector) / n%8 columns.
type vecKind struct {
	name  string
	width int
	load  func(addr string, dst int)
}

var vecKinds = []vecKind{
	{"F32", 4, func(a string, d int) { p("VMOVUPS %s, Y%d", a, d) }},
	{"F16", 2, func(a string, d int) { p("VCVTPH2PS %s, Y%d", a, d) }},
	{"BF16", 2, func(a string, d int) { p("VPMOVZXWD %s, Y%d", a, d); p("VPSLLD $16, Y%d, Y%d", d, d) }},
}

func dot(k vecKind) {
	fmt.Fprintf(&b, "\n// func dot%sAVX2(a *float32, b unsafe.Pointer, n int) float32\n", k.name)
	fmt.Fprintf(&b, "TEXT ·dot%sAVX2(SB), NOSPLIT, $0-28\n", k.name)
	p("MOVQ a+0(FP), SI")
	p("MOVQ b+8(FP), DI")
	p("MOVQ n+16(FP), CX")
	for i := 0; i < 4; i++ {
		p("VXORPS Y%d, Y%d, Y%d", i, i, i)
	}
	fmt.Fprintf(&b, "loop32:\n")
	p("CMPQ CX, $32")
	p("JLT loop8")
	for i := 0; i < 4; i++ {
		k.load(fmt.Sprintf("%d(DI)", 8*k.width*i), 4+i)
	}
	for i := 0; i < 4; i++ {
		p("VFMADD231PS %d(SI), Y%d, Y%d", 32*i, 4+i, i)
	}
	p("ADDQ $128, SI")
	p("ADDQ $%d, DI", 32*k.width)
	p("SUBQ $32, CX")
	p("JMP loop32")
	fmt.Fprintf(&b, "loop8:\n")
	p("CMPQ CX, $8")
	p("JLT done")
	k.load("(DI)", 4)
	p("VFMADD231PS (SI), Y4, Y0")
	p("ADDQ $32, SI")
	p("ADDQ $%d, DI", 8*k.width)
	p("SUBQ $8, CX")
	p("JMP loop8")
	fmt.Fprintf(&b, "done:\n")
	p("VADDPS Y1, Y0, Y0")
	p("VADDPS Y3, Y2, Y2")
	p("VADDPS Y2, Y0, Y0")
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

func axpy(k vecKind) {
	fmt.Fprintf(&b, "\n// func axpy%sAVX2(out *float32, a float32, x unsafe.Pointer, n int)\n", k.name)
	fmt.Fprintf(&b, "TEXT ·axpy%sAVX2(SB), NOSPLIT, $0-32\n", k.name)
	p("MOVQ out+0(FP), DI")
	p("VBROADCASTSS a+8(FP), Y15")
	p("MOVQ x+16(FP), SI")
	p("MOVQ n+24(FP), CX")
	fmt.Fprintf(&b, "loop8:\n")
	p("CMPQ CX, $8")
	p("JLT done")
	k.load("(SI)", 4)
	p("VFMADD213PS (DI), Y15, Y4")
	p("VMOVUPS Y4, (DI)")
	p("ADDQ $32, DI")
	p("ADDQ $%d, SI", 8*k.width)
	p("SUBQ $8, CX")
	p("JMP loop8")
	fmt.Fprintf(&b, "done:\n")
	p("VZEROUPPER")
	p("RET")
}

// floatGemm: 4 weight rows × n (1 or 2) activation rows, 8 columns a step.
func floatGemm(k vecKind, n int) {
	name := fmt.Sprintf("gemm%s_avx2_4x%d", k.name, n)
	fmt.Fprintf(&b, "\n// func %s(w *byte, ws int, x *float32, xs int, nblk int, out *float32)\n", name)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-48\n", name)
	p("MOVQ w+0(FP), DI")
	p("MOVQ ws+8(FP), R8")
	p("MOVQ x+16(FP), SI")
	p("MOVQ xs+24(FP), R11")
	p("MOVQ nblk+32(FP), CX")
	p("MOVQ out+40(FP), R9")
	p("LEAQ (R8)(R8*2), R10")
	for i := 0; i < 4*n; i++ {
		p("VXORPS Y%d, Y%d, Y%d", i, i, i)
	}
	waddr := []string{"(DI)", "(DI)(R8*1)", "(DI)(R8*2)", "(DI)(R10*1)"}
	xaddr := []string{"(SI)", "(SI)(R11*1)"}
	fmt.Fprintf(&b, "loop:\n")
	for r := 0; r < 4; r++ {
		k.load(waddr[r], 8+r)
	}
	for i := 0; i < n; i++ {
		p("VMOVUPS %s, Y%d", xaddr[i], 12+i)
	}
	for i := 0; i < n; i++ {
		for r := 0; r < 4; r++ {
			p("VFMADD231PS Y%d, Y%d, Y%d", 12+i, 8+r, 4*i+r)
		}
	}
	p("ADDQ $%d, DI", 8*k.width)
	p("ADDQ $32, SI")
	p("DECQ CX")
	p("JNZ loop")
	for i := 0; i < 4*n; i++ {
		p("VMOVUPS Y%d, %d(R9)", i, 32*i)
	}
	p("VZEROUPPER")
	p("RET")
}

func main() {
	b.WriteString("// Code generated by gen_avx2.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	var g bytes.Buffer
	g.WriteString("// Code generated by gen_avx2.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage kernels\n\nimport \"unsafe\"\n\n")
	for _, k := range intKinds {
		for n := 1; n <= 4; n++ {
			intKernel(k, n)
			fmt.Fprintf(&g, "//go:noescape\nfunc gemm%s_avx2_%d(w *byte, x *int8, st *float32, out *float32, nb, half, xs, ss int)\n\n", k.name, n)
		}
		fmt.Fprintf(&g, "var gemm%s_avx2 = [5]gemmKernel2{nil", k.name)
		for n := 1; n <= 4; n++ {
			fmt.Fprintf(&g, ", gemm%s_avx2_%d", k.name, n)
		}
		g.WriteString("}\n\n")
	}
	for _, k := range vecKinds {
		dot(k)
		axpy(k)
		fmt.Fprintf(&g, "//go:noescape\nfunc dot%sAVX2(a *float32, b unsafe.Pointer, n int) float32\n\n", k.name)
		fmt.Fprintf(&g, "//go:noescape\nfunc axpy%sAVX2(out *float32, a float32, x unsafe.Pointer, n int)\n\n", k.name)
		for n := 1; n <= 2; n++ {
			floatGemm(k, n)
			fmt.Fprintf(&g, "//go:noescape\nfunc gemm%s_avx2_4x%d(w *byte, ws int, x *float32, xs int, nblk int, out *float32)\n\n", k.name, n)
		}
		fmt.Fprintf(&g, "var gemm%s_avx2 = [3]floatKernel{nil, gemm%s_avx2_4x1, gemm%s_avx2_4x2}\n\n", k.name, k.name, k.name)
	}
	if err := os.WriteFile("avx2_amd64.s", b.Bytes(), 0o644); err != nil {
		panic(err)
	}
	src, err := format.Source(g.Bytes())
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile("avx2_stubs_amd64.go", src, 0o644); err != nil {
		panic(err)
	}
}
