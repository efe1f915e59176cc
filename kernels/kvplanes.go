package kernels

import "fmt"

// Attention over KIVI codes: bits-bit unsigned codes packed low first, a
// byte holding P = 8/bits consecutive channels. The caller splits its
// per-channel vector into P planes (plane k holds channels c ≡ k mod P, in
// order), so byte j of a row meets element j of every plane and the
// kernels never shuffle: Scores sets s[t] = Σ_k Σ_j planes[k][j]·code_k(row_t[j]);
// Mix adds w[t]·code_k(row_t[j]) to planes[k][j]. len(planes) is the
// row's channels; a row is len(planes)·bits/8 bytes, rows stride apart.

// PlaneAttn is the kernel pair over one code width.
type PlaneAttn struct {
	Scores func(s, planes []float32, codes []byte, stride int)
	Mix    func(planes, w []float32, codes []byte, stride int)
}

// AttnPlanes is o's kernel pair over bits-bit codes (2 or 4).
func (o *Ops) AttnPlanes(bits int) PlaneAttn {
	if bits != 2 && bits != 4 {
		panic(fmt.Sprintf("kernels: %d-bit codes", bits))
	}
	return planeAttnFor(o.name, bits)
}

func checkPlaneRows(name string, n, chans, bytes, stride, bits int) {
	rb := chans * bits / 8
	if chans*bits%8 != 0 || (n > 0 && (stride < rb || (n-1)*stride+rb > bytes)) {
		panic(fmt.Sprintf("kernels: %s: %d rows of %d %d-bit codes, stride %d, in %d bytes", name, n, chans, bits, stride, bytes))
	}
}

func planeAttnRef(bits int) PlaneAttn {
	p, mask := 8/bits, byte(1<<bits-1)
	return PlaneAttn{
		Scores: func(s, planes []float32, codes []byte, stride int) {
			checkPlaneRows("Scores", len(s), len(planes), len(codes), stride, bits)
			pl := len(planes) / p
			for t := range s {
				row := codes[t*stride : t*stride+pl]
				var acc float32
				for k := 0; k < p; k++ {
					pk := planes[k*pl : (k+1)*pl]
					for j, b := range row {
						acc += pk[j] * float32(b>>(bits*k)&mask)
					}
				}
				s[t] = acc
			}
		},
		Mix: func(planes, w []float32, codes []byte, stride int) {
			checkPlaneRows("Mix", len(w), len(planes), len(codes), stride, bits)
			pl := len(planes) / p
			for t, a := range w {
				row := codes[t*stride : t*stride+pl]
				for k := 0; k < p; k++ {
					pk := planes[k*pl : (k+1)*pl]
					for j, b := range row {
						pk[j] += a * float32(b>>(bits*k)&mask)
					}
				}
			}
		},
	}
}
