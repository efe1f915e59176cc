//go:build amd64 && !purego

#include "textflag.h"

DATA absmask<>+0(SB)/4, $0x7fffffff
GLOBL absmask<>(SB), RODATA|NOPTR, $4
DATA signmask<>+0(SB)/4, $0x80000000
GLOBL signmask<>(SB), RODATA|NOPTR, $4
DATA half<>+0(SB)/4, $0x3f000000
GLOBL half<>(SB), RODATA|NOPTR, $4
DATA one<>+0(SB)/4, $0x3f800000
GLOBL one<>(SB), RODATA|NOPTR, $4
DATA c127<>+0(SB)/4, $0x42fe0000
GLOBL c127<>(SB), RODATA|NOPTR, $4
DATA cm127<>+0(SB)/4, $0xc2fe0000
GLOBL cm127<>(SB), RODATA|NOPTR, $4

// Horizontal max of Z2 into X2 (clobbers Z3).
#define HMAX \
	VEXTRACTF64X4 $1, Z2, Y3 \
	VMAXPS Y3, Y2, Y2 \
	VEXTRACTF128 $1, Y2, X3 \
	VMAXPS X3, X2, X2 \
	VPERMILPS $0x4e, X2, X3 \
	VMAXPS X3, X2, X2 \
	VPERMILPS $0xb1, X2, X3 \
	VMAXSS X3, X2, X2

// Horizontal int32 sum of Z10 into X10 (clobbers Z11).
#define HSUMD \
	VEXTRACTI64X4 $1, Z10, Y11 \
	VPADDD Y11, Y10, Y10 \
	VEXTRACTI128 $1, Y10, X11 \
	VPADDD X11, X10, X10 \
	VPSHUFD $0x4e, X10, X11 \
	VPADDD X11, X10, X10 \
	VPSHUFD $0xb1, X10, X11 \
	VPADDD X11, X10, X10

// func quantQ80AVX512(x *float32, nblk int, q *int8, qstride int, st *float32, ststride int, k float32)
// Per 32 elements, as quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d),
// then writes {f16(d), k·f16(d)·Σq} to st.
TEXT ·quantQ80AVX512(SB), NOSPLIT, $0-52
	MOVQ x+0(FP), SI
	MOVQ nblk+8(FP), CX
	MOVQ q+16(FP), DI
	MOVQ qstride+24(FP), R8
	MOVQ st+32(FP), DX
	MOVQ ststride+40(FP), R9
	VMOVSS k+48(FP), X14
	VBROADCASTSS absmask<>(SB), Z31
	VBROADCASTSS half<>(SB), Z30
	VBROADCASTSS one<>(SB), Z29
	VBROADCASTSS signmask<>(SB), Z28
	VMOVSS c127<>(SB), X15
	VMOVSS one<>(SB), X13
	TESTQ CX, CX
	JZ q80done
q80loop:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VANDPS Z31, Z0, Z2
	VANDPS Z31, Z1, Z3
	VMAXPS Z3, Z2, Z2
	HMAX
	VDIVSS X15, X2, X4
	VXORPS X5, X5, X5
	VUCOMISS X5, X4
	JEQ q80zero
	VDIVSS X4, X13, X5
q80zero:
	VBROADCASTSS X5, Z5
	VMULPS Z5, Z0, Z0
	VMULPS Z5, Z1, Z1
	// roundf: trunc, then step away from zero where |frac| >= 0.5.
	VRNDSCALEPS $0x0b, Z0, Z6
	VSUBPS Z6, Z0, Z7
	VANDPS Z31, Z7, Z7
	VCMPPS $0x1d, Z30, Z7, K1
	VPANDD Z28, Z0, Z8
	VPORD Z29, Z8, Z8
	VADDPS Z8, Z6, K1, Z6
	VRNDSCALEPS $0x0b, Z1, Z9
	VSUBPS Z9, Z1, Z7
	VANDPS Z31, Z7, Z7
	VCMPPS $0x1d, Z30, Z7, K2
	VPANDD Z28, Z1, Z8
	VPORD Z29, Z8, Z8
	VADDPS Z8, Z9, K2, Z9
	VCVTTPS2DQ Z6, Z6
	VCVTTPS2DQ Z9, Z9
	VPMOVSDB Z6, (DI)
	VPMOVSDB Z9, 16(DI)
	VPADDD Z9, Z6, Z10
	HSUMD
	VCVTPS2PH $0, X4, X12
	VCVTPH2PS X12, X12
	VMOVSS X12, (DX)
	VCVTDQ2PS X10, X10
	VMULSS X12, X14, X11
	VMULSS X10, X11, X11
	VMOVSS X11, 4(DX)
	ADDQ $128, SI
	ADDQ R8, DI
	ADDQ R9, DX
	DECQ CX
	JNZ q80loop
q80done:
	VZEROUPPER
	RET

// func quantQ8KAVX512(x *float32, nsb int, q *int8, qstride int, st *float32, ststride int, k float32, blk32, nodx bool)
// Per 256 elements, as quantize_row_q8_K_ref: iscale = −127/max (max the
// first element of largest magnitude), q = nearest_int(iscale·x), d =
// 1/iscale; then per 16 (or 32 with blk32) elements writes the q bytes and
// {d, k·d·Σq} ({d, k·Σq} with nodx).
TEXT ·quantQ8KAVX512(SB), NOSPLIT, $0-54
	MOVQ x+0(FP), SI
	MOVQ nsb+8(FP), CX
	MOVQ q+16(FP), DI
	MOVQ qstride+24(FP), R8
	MOVQ st+32(FP), DX
	MOVQ ststride+40(FP), R9
	VBROADCASTSS absmask<>(SB), Z31
	VMOVSS one<>(SB), X13
	VMOVSS cm127<>(SB), X15
	TESTQ CX, CX
	JZ q8kdone
q8kloop:
	VANDPS (SI), Z31, Z2
	XORQ R10, R10
q8kmax:
	ADDQ $64, R10
	CMPQ R10, $1024
	JEQ q8kmaxdone
	VANDPS (SI)(R10*1), Z31, Z3
	VMAXPS Z3, Z2, Z2
	JMP q8kmax
q8kmaxdone:
	HMAX
	VXORPS X5, X5, X5
	VUCOMISS X5, X2
	JEQ q8kzero
	VBROADCASTSS X2, Z2
	XORQ R10, R10
q8kfind:
	VANDPS (SI)(R10*1), Z31, Z3
	VCMPPS $0, Z2, Z3, K1
	KORTESTW K1, K1
	JNZ q8kfound
	ADDQ $64, R10
	JMP q8kfind
q8kfound:
	KMOVW K1, AX
	TZCNTL AX, AX
	LEAQ (R10)(AX*4), R11
	VMOVSS (SI)(R11*1), X3
	VDIVSS X3, X15, X4
	VDIVSS X4, X13, X5
	VMULSS k+48(FP), X5, X12
	CMPB nodx+53(FP), $0
	JEQ q8kscaled
	VMOVSS k+48(FP), X12
q8kscaled:
	VBROADCASTSS X4, Z4
	CMPB blk32+52(FP), $0
	JNE q8k32
	MOVQ $16, R10
q8kblk:
	VMULPS (SI), Z4, Z6
	VCVTPS2DQ Z6, Z6
	VPMOVSDB Z6, (DI)
	VMOVDQA64 Z6, Z10
	HSUMD
	VCVTDQ2PS X10, X10
	VMULSS X10, X12, X10
	VMOVSS X5, (DX)
	VMOVSS X10, 4(DX)
	ADDQ $64, SI
	ADDQ R8, DI
	ADDQ R9, DX
	DECQ R10
	JNZ q8kblk
	DECQ CX
	JNZ q8kloop
	JMP q8kdone
q8k32:
	MOVQ $8, R10
q8k32blk:
	VMULPS (SI), Z4, Z6
	VMULPS 64(SI), Z4, Z7
	VCVTPS2DQ Z6, Z6
	VCVTPS2DQ Z7, Z7
	VPMOVSDB Z6, (DI)
	VPMOVSDB Z7, 16(DI)
	VPADDD Z7, Z6, Z10
	HSUMD
	VCVTDQ2PS X10, X10
	VMULSS X10, X12, X10
	VMOVSS X5, (DX)
	VMOVSS X10, 4(DX)
	ADDQ $128, SI
	ADDQ R8, DI
	ADDQ R9, DX
	DECQ R10
	JNZ q8k32blk
	DECQ CX
	JNZ q8kloop
	JMP q8kdone
q8kzero:
	MOVQ $16, R10
	VXORPS X6, X6, X6
	CMPB blk32+52(FP), $0
	JEQ q8kzblk
	MOVQ $8, R10
q8kzblk:
	// 32-element slots: zero both halves and step over 128 bytes of x.
	VMOVDQU X6, (DI)
	CMPB blk32+52(FP), $0
	JEQ q8kz16
	VMOVDQU X6, 16(DI)
	ADDQ $64, SI
q8kz16:
	VMOVSS X6, (DX)
	VMOVSS X6, 4(DX)
	ADDQ $64, SI
	ADDQ R8, DI
	ADDQ R9, DX
	DECQ R10
	JNZ q8kzblk
	DECQ CX
	JNZ q8kloop
q8kdone:
	VZEROUPPER
	RET
