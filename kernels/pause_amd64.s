//go:build amd64 && !purego

#include "textflag.h"

// func spinPause()
TEXT ·spinPause(SB), NOSPLIT, $0-0
	PAUSE
	RET

// func prefetchRows(p unsafe.Pointer, n, stride, lines int)
TEXT ·prefetchRows(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ stride+16(FP), DX
	MOVQ lines+24(FP), BX
	TESTQ CX, CX
	JZ pdone
prow:
	MOVQ SI, DI
	MOVQ BX, AX
pline:
	PREFETCHT1 (DI)
	ADDQ $64, DI
	DECQ AX
	JNZ pline
	ADDQ DX, SI
	DECQ CX
	JNZ prow
pdone:
	RET
