//go:build !amd64 || purego

package kernels

func blockAttnFor(isa string, f blockFmt) BlockAttn { return blockRef(f) }

func planeAttnFor(isa string, bits int) PlaneAttn { return planeAttnRef(bits) }
