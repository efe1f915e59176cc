//go:build amd64 && !purego

#include "textflag.h"

DATA e2log2e<>+0(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+4(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+8(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+12(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+16(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+20(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+24(SB)/4, $0x3fb8aa3b
DATA e2log2e<>+28(SB)/4, $0x3fb8aa3b
GLOBL e2log2e<>(SB), RODATA|NOPTR, $32
DATA e2ln2hi<>+0(SB)/4, $0x3f318000
DATA e2ln2hi<>+4(SB)/4, $0x3f318000
DATA e2ln2hi<>+8(SB)/4, $0x3f318000
DATA e2ln2hi<>+12(SB)/4, $0x3f318000
DATA e2ln2hi<>+16(SB)/4, $0x3f318000
DATA e2ln2hi<>+20(SB)/4, $0x3f318000
DATA e2ln2hi<>+24(SB)/4, $0x3f318000
DATA e2ln2hi<>+28(SB)/4, $0x3f318000
GLOBL e2ln2hi<>(SB), RODATA|NOPTR, $32
DATA e2ln2lo<>+0(SB)/4, $0xb95e8083
DATA e2ln2lo<>+4(SB)/4, $0xb95e8083
DATA e2ln2lo<>+8(SB)/4, $0xb95e8083
DATA e2ln2lo<>+12(SB)/4, $0xb95e8083
DATA e2ln2lo<>+16(SB)/4, $0xb95e8083
DATA e2ln2lo<>+20(SB)/4, $0xb95e8083
DATA e2ln2lo<>+24(SB)/4, $0xb95e8083
DATA e2ln2lo<>+28(SB)/4, $0xb95e8083
GLOBL e2ln2lo<>(SB), RODATA|NOPTR, $32
DATA e2p0<>+0(SB)/4, $0x39506967
DATA e2p0<>+4(SB)/4, $0x39506967
DATA e2p0<>+8(SB)/4, $0x39506967
DATA e2p0<>+12(SB)/4, $0x39506967
DATA e2p0<>+16(SB)/4, $0x39506967
DATA e2p0<>+20(SB)/4, $0x39506967
DATA e2p0<>+24(SB)/4, $0x39506967
DATA e2p0<>+28(SB)/4, $0x39506967
GLOBL e2p0<>(SB), RODATA|NOPTR, $32
DATA e2p1<>+0(SB)/4, $0x3ab743ce
DATA e2p1<>+4(SB)/4, $0x3ab743ce
DATA e2p1<>+8(SB)/4, $0x3ab743ce
DATA e2p1<>+12(SB)/4, $0x3ab743ce
DATA e2p1<>+16(SB)/4, $0x3ab743ce
DATA e2p1<>+20(SB)/4, $0x3ab743ce
DATA e2p1<>+24(SB)/4, $0x3ab743ce
DATA e2p1<>+28(SB)/4, $0x3ab743ce
GLOBL e2p1<>(SB), RODATA|NOPTR, $32
DATA e2p2<>+0(SB)/4, $0x3c088908
DATA e2p2<>+4(SB)/4, $0x3c088908
DATA e2p2<>+8(SB)/4, $0x3c088908
DATA e2p2<>+12(SB)/4, $0x3c088908
DATA e2p2<>+16(SB)/4, $0x3c088908
DATA e2p2<>+20(SB)/4, $0x3c088908
DATA e2p2<>+24(SB)/4, $0x3c088908
DATA e2p2<>+28(SB)/4, $0x3c088908
GLOBL e2p2<>(SB), RODATA|NOPTR, $32
DATA e2p3<>+0(SB)/4, $0x3d2aa9c1
DATA e2p3<>+4(SB)/4, $0x3d2aa9c1
DATA e2p3<>+8(SB)/4, $0x3d2aa9c1
DATA e2p3<>+12(SB)/4, $0x3d2aa9c1
DATA e2p3<>+16(SB)/4, $0x3d2aa9c1
DATA e2p3<>+20(SB)/4, $0x3d2aa9c1
DATA e2p3<>+24(SB)/4, $0x3d2aa9c1
DATA e2p3<>+28(SB)/4, $0x3d2aa9c1
GLOBL e2p3<>(SB), RODATA|NOPTR, $32
DATA e2p4<>+0(SB)/4, $0x3e2aaaaa
DATA e2p4<>+4(SB)/4, $0x3e2aaaaa
DATA e2p4<>+8(SB)/4, $0x3e2aaaaa
DATA e2p4<>+12(SB)/4, $0x3e2aaaaa
DATA e2p4<>+16(SB)/4, $0x3e2aaaaa
DATA e2p4<>+20(SB)/4, $0x3e2aaaaa
DATA e2p4<>+24(SB)/4, $0x3e2aaaaa
DATA e2p4<>+28(SB)/4, $0x3e2aaaaa
GLOBL e2p4<>(SB), RODATA|NOPTR, $32
DATA e2p5<>+0(SB)/4, $0x3f000000
DATA e2p5<>+4(SB)/4, $0x3f000000
DATA e2p5<>+8(SB)/4, $0x3f000000
DATA e2p5<>+12(SB)/4, $0x3f000000
DATA e2p5<>+16(SB)/4, $0x3f000000
DATA e2p5<>+20(SB)/4, $0x3f000000
DATA e2p5<>+24(SB)/4, $0x3f000000
DATA e2p5<>+28(SB)/4, $0x3f000000
GLOBL e2p5<>(SB), RODATA|NOPTR, $32
DATA e2one<>+0(SB)/4, $0x3f800000
DATA e2one<>+4(SB)/4, $0x3f800000
DATA e2one<>+8(SB)/4, $0x3f800000
DATA e2one<>+12(SB)/4, $0x3f800000
DATA e2one<>+16(SB)/4, $0x3f800000
DATA e2one<>+20(SB)/4, $0x3f800000
DATA e2one<>+24(SB)/4, $0x3f800000
DATA e2one<>+28(SB)/4, $0x3f800000
GLOBL e2one<>(SB), RODATA|NOPTR, $32
DATA e2hi<>+0(SB)/4, $0x42b0a3d7
DATA e2hi<>+4(SB)/4, $0x42b0a3d7
DATA e2hi<>+8(SB)/4, $0x42b0a3d7
DATA e2hi<>+12(SB)/4, $0x42b0a3d7
DATA e2hi<>+16(SB)/4, $0x42b0a3d7
DATA e2hi<>+20(SB)/4, $0x42b0a3d7
DATA e2hi<>+24(SB)/4, $0x42b0a3d7
DATA e2hi<>+28(SB)/4, $0x42b0a3d7
GLOBL e2hi<>(SB), RODATA|NOPTR, $32
DATA e2lo<>+0(SB)/4, $0xc2ae999a
DATA e2lo<>+4(SB)/4, $0xc2ae999a
DATA e2lo<>+8(SB)/4, $0xc2ae999a
DATA e2lo<>+12(SB)/4, $0xc2ae999a
DATA e2lo<>+16(SB)/4, $0xc2ae999a
DATA e2lo<>+20(SB)/4, $0xc2ae999a
DATA e2lo<>+24(SB)/4, $0xc2ae999a
DATA e2lo<>+28(SB)/4, $0xc2ae999a
GLOBL e2lo<>(SB), RODATA|NOPTR, $32
DATA e2i127<>+0(SB)/4, $0x0000007f
DATA e2i127<>+4(SB)/4, $0x0000007f
DATA e2i127<>+8(SB)/4, $0x0000007f
DATA e2i127<>+12(SB)/4, $0x0000007f
DATA e2i127<>+16(SB)/4, $0x0000007f
DATA e2i127<>+20(SB)/4, $0x0000007f
DATA e2i127<>+24(SB)/4, $0x0000007f
DATA e2i127<>+28(SB)/4, $0x0000007f
GLOBL e2i127<>(SB), RODATA|NOPTR, $32

// EXP8(z): z = exp(z) on 8 lanes, the polynomial of ops_amd64.s; 2^n is
// built in the exponent field, so inputs are clamped to [-87.3, 88.32]
// (results below 2^-126 come out as about 1e-38 instead of 0). Clobbers
// Y1, Y2, Y3.
#define EXP8(z) \
	VMINPS e2hi<>(SB), z, z \
	VMAXPS e2lo<>(SB), z, z \
	VMULPS e2log2e<>(SB), z, Y1 \
	VROUNDPS $0, Y1, Y1 \
	VFNMADD231PS e2ln2hi<>(SB), Y1, z \
	VFNMADD231PS e2ln2lo<>(SB), Y1, z \
	VMOVUPS e2p0<>(SB), Y2 \
	VFMADD213PS e2p1<>(SB), z, Y2 \
	VFMADD213PS e2p2<>(SB), z, Y2 \
	VFMADD213PS e2p3<>(SB), z, Y2 \
	VFMADD213PS e2p4<>(SB), z, Y2 \
	VFMADD213PS e2p5<>(SB), z, Y2 \
	VMULPS z, z, Y3 \
	VFMADD213PS z, Y3, Y2 \
	VADDPS e2one<>(SB), Y2, Y2 \
	VCVTPS2DQ Y1, Y3 \
	VPADDD e2i127<>(SB), Y3, Y3 \
	VPSLLD $23, Y3, Y3 \
	VMULPS Y3, Y2, z

// func expSubSumAVX2(x *float32, n int, m float32) float32
// x[i] = exp(x[i]-m) for i < n (a multiple of 8); returns the sum.
TEXT ·expSubSumAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS m+16(FP), Y5
	VXORPS Y6, Y6, Y6
loop:
	CMPQ CX, $8
	JLT done
	VMOVUPS (SI), Y0
	VSUBPS Y5, Y0, Y0
	EXP8(Y0)
	VMOVUPS Y0, (SI)
	VADDPS Y0, Y6, Y6
	ADDQ $32, SI
	SUBQ $8, CX
	JMP loop
done:
	VEXTRACTF128 $1, Y6, X7
	VADDPS X7, X6, X6
	VPERMILPS $0x4e, X6, X7
	VADDPS X7, X6, X6
	VPERMILPS $0xb1, X6, X7
	VADDSS X7, X6, X6
	VZEROUPPER
	MOVSS X6, ret+24(FP)
	RET

// func siluMulAVX2(out, gate, u *float32, n int)
// out[i] = gate[i]/(1+exp(-gate[i]))·u[i] for i < n (a multiple of 8).
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ u+16(FP), DX
	MOVQ n+24(FP), CX
	VXORPS Y9, Y9, Y9
loop:
	CMPQ CX, $8
	JLT done
	VMOVUPS (SI), Y4
	VSUBPS Y4, Y9, Y0
	EXP8(Y0)
	VADDPS e2one<>(SB), Y0, Y0
	VDIVPS Y0, Y4, Y4
	VMULPS (DX), Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP loop
done:
	VZEROUPPER
	RET
