//go:build amd64 && !purego

#include "textflag.h"

DATA expc<>+0(SB)/4, $0x3fb8aa3b  // log2(e)
DATA expc<>+4(SB)/4, $0x3f318000  // ln2 hi 0.693359375
DATA expc<>+8(SB)/4, $0xb95e8083  // ln2 lo -2.12194440e-4
DATA expc<>+12(SB)/4, $0x39506967 // 1.9875691500e-4
DATA expc<>+16(SB)/4, $0x3ab743ce // 1.3981999507e-3
DATA expc<>+20(SB)/4, $0x3c088908 // 8.3334519073e-3
DATA expc<>+24(SB)/4, $0x3d2aa9c1 // 4.1665795894e-2
DATA expc<>+28(SB)/4, $0x3e2aaaaa // 1.6666665459e-1
DATA expc<>+32(SB)/4, $0x3f000000 // 0.5
DATA expc<>+36(SB)/4, $0x3f800000 // 1
DATA expc<>+40(SB)/4, $0x42b20000 // 89
DATA expc<>+44(SB)/4, $0xc2d00000 // -104
DATA expc<>+48(SB)/4, $0xff800000 // -inf
GLOBL expc<>(SB), RODATA|NOPTR, $52

#define LOADEXPC \
	VBROADCASTSS expc<>+0(SB), Z20 \
	VBROADCASTSS expc<>+4(SB), Z21 \
	VBROADCASTSS expc<>+8(SB), Z22 \
	VBROADCASTSS expc<>+12(SB), Z23 \
	VBROADCASTSS expc<>+16(SB), Z24 \
	VBROADCASTSS expc<>+20(SB), Z25 \
	VBROADCASTSS expc<>+24(SB), Z26 \
	VBROADCASTSS expc<>+28(SB), Z27 \
	VBROADCASTSS expc<>+32(SB), Z28 \
	VBROADCASTSS expc<>+36(SB), Z29 \
	VBROADCASTSS expc<>+40(SB), Z30 \
	VBROADCASTSS expc<>+44(SB), Z31

// EXP(z): z = exp(z), Cephes expf polynomial, 2^n applied by VSCALEFPS so
// underflow goes to 0 and overflow to +Inf. Clobbers Z1, Z2, Z3.
#define EXP(z) \
	VMINPS Z30, z, z \
	VMAXPS Z31, z, z \
	VMULPS Z20, z, Z1 \
	VRNDSCALEPS $0x08, Z1, Z1 \
	VFNMADD231PS Z21, Z1, z \
	VFNMADD231PS Z22, Z1, z \
	VMOVAPS Z23, Z2 \
	VFMADD213PS Z24, z, Z2 \
	VFMADD213PS Z25, z, Z2 \
	VFMADD213PS Z26, z, Z2 \
	VFMADD213PS Z27, z, Z2 \
	VFMADD213PS Z28, z, Z2 \
	VMULPS z, z, Z3 \
	VFMADD213PS z, Z3, Z2 \
	VADDPS Z29, Z2, Z2 \
	VSCALEFPS Z1, Z2, z

#define TAILMASK \
	MOVL $1, AX \
	SHLL CX, AX \
	DECL AX \
	KMOVW AX, K1

// func siluMulAVX512(out, gate, u *float32, n int)
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-32
	LOADEXPC
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ u+16(FP), DX
	MOVQ n+24(FP), CX
	VPXORD Z9, Z9, Z9
silu:
	CMPQ CX, $16
	JLT silutail
	VMOVUPS (SI), Z4
	VSUBPS Z4, Z9, Z0
	EXP(Z0)
	VADDPS Z29, Z0, Z0
	VDIVPS Z0, Z4, Z4
	VMULPS (DX), Z4, Z4
	VMOVUPS Z4, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JMP silu
silutail:
	TESTQ CX, CX
	JZ siludone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z4
	VMOVUPS.Z (DX), K1, Z5
	VSUBPS Z4, Z9, Z0
	EXP(Z0)
	VADDPS Z29, Z0, Z0
	VDIVPS Z0, Z4, Z4
	VMULPS Z5, Z4, Z4
	VMOVUPS Z4, K1, (DI)
siludone:
	VZEROUPPER
	RET

// func scaleMulAVX512(out, x, w *float32, s float32, n int)
// out[i] = x[i]·s·w[i] (w nil: x[i]·s).
TEXT ·scaleMulAVX512(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	VBROADCASTSS s+24(FP), Z8
	MOVQ n+32(FP), CX
	TESTQ DX, DX
	JZ sc1
scw:
	CMPQ CX, $16
	JLT scwtail
	VMULPS (SI), Z8, Z0
	VMULPS (DX), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JMP scw
scwtail:
	TESTQ CX, CX
	JZ scdone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z (DX), K1, Z1
	VMULPS Z8, Z0, Z0
	VMULPS Z1, Z0, Z0
	VMOVUPS Z0, K1, (DI)
	JMP scdone
sc1:
	CMPQ CX, $16
	JLT sc1tail
	VMULPS (SI), Z8, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP sc1
sc1tail:
	TESTQ CX, CX
	JZ scdone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VMULPS Z8, Z0, Z0
	VMOVUPS Z0, K1, (DI)
scdone:
	VZEROUPPER
	RET

// func softmaxOnlineAVX512(x *float32, n int, scale, m float32) (mx, sum float32)
// x = exp(scale·x − mx) with mx = max(m, scale·x), returning mx and Σ x:
// one block of an online softmax.
TEXT ·softmaxOnlineAVX512(SB), NOSPLIT, $0-32
	LOADEXPC
	VBROADCASTSS scale+16(FP), Z9
	VBROADCASTSS m+20(FP), Z10
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
omax:
	CMPQ CX, $16
	JLT omaxtail
	VMULPS (SI), Z9, Z0
	VMOVUPS Z0, (SI)
	VMAXPS Z0, Z10, Z10
	ADDQ $64, SI
	SUBQ $16, CX
	JMP omax
omaxtail:
	TESTQ CX, CX
	JZ omaxdone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VMULPS Z0, Z9, Z0
	VMOVUPS Z0, K1, (SI)
	VMAXPS Z0, Z10, K1, Z10
omaxdone:
	VEXTRACTF64X4 $1, Z10, Y11
	VMAXPS Y11, Y10, Y10
	VEXTRACTF128 $1, Y10, X11
	VMAXPS X11, X10, X10
	VPERMILPS $0x4e, X10, X11
	VMAXPS X11, X10, X10
	VPERMILPS $0xb1, X10, X11
	VMAXPS X11, X10, X10
	VMOVSS X10, mx+24(FP)
	VBROADCASTSS X10, Z11
	VPXORD Z12, Z12, Z12
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
oexp:
	CMPQ CX, $16
	JLT oexptail
	VMOVUPS (SI), Z0
	VSUBPS Z11, Z0, Z0
	EXP(Z0)
	VMOVUPS Z0, (SI)
	VADDPS Z0, Z12, Z12
	ADDQ $64, SI
	SUBQ $16, CX
	JMP oexp
oexptail:
	TESTQ CX, CX
	JZ oexpdone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VSUBPS Z11, Z0, Z0
	EXP(Z0)
	VMOVUPS Z0, K1, (SI)
	VADDPS Z0, Z12, K1, Z12
oexpdone:
	VEXTRACTF64X4 $1, Z12, Y13
	VADDPS Y13, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VPERMILPS $0x4e, X12, X13
	VADDPS X13, X12, X12
	VPERMILPS $0xb1, X12, X13
	VADDPS X13, X12, X12
	VMOVSS X12, sum+28(FP)
	VZEROUPPER
	RET
