package kernels

// The assembly of the matmul, vector and KV attention kernels is written by
// programs, not by hand; .ci/run regenerates it and fails when the
// committed files differ.
//go:generate go run gen_asm.go
//go:generate go run gen_avx2.go
//go:generate go run gen_kvquant.go
