//go:build !amd64 || purego

package kernels

func blockAttnFor(isa string, bb int) BlockAttn { return blockAttnRef(bb) }

func planeAttnFor(isa string, bits int) PlaneAttn { return planeAttnRef(bits) }
