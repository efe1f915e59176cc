package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"pagoda/quant"
)

var newBlockFmts = []struct {
	f    blockFmt
	q    quant.Type
	attn func(o *Ops) BlockAttn
}{
	{fmtQ4_1, quant.Q4_1, (*Ops).AttnQ4_1},
	{fmtQ5_0, quant.Q5_0, (*Ops).AttnQ5_0},
	{fmtQ5_1, quant.Q5_1, (*Ops).AttnQ5_1},
	{fmtIQ4_NL, quant.IQ4_NL, (*Ops).AttnIQ4_NL},
}

// randFmtBlocks fills rows of nb random blocks of format f, stride bytes
// apart: scales (and mins) of either sign around 0.01–1, codes and high
// bits random.
func randFmtBlocks(r *rand.Rand, f blockFmt, n, nb, stride int) []byte {
	bb := blockFmtBytes[f]
	k := make([]byte, max(0, (n-1)*stride+nb*bb))
	for i := range k {
		k[i] = byte(r.UintN(256))
	}
	half := func() uint16 {
		return f32ToF16(float32(r.Float64()*0.99+0.01) * float32(1-2*int(r.UintN(2))))
	}
	for t := 0; t < n; t++ {
		for b := 0; b < nb; b++ {
			o := t*stride + b*bb
			binary.LittleEndian.PutUint16(k[o:], half())
			if f == fmtQ4_1 || f == fmtQ5_1 {
				binary.LittleEndian.PutUint16(k[o+2:], half())
			}
		}
	}
	return k
}

// TestDecodeBlockMatchesQuant: the references decode blocks as package
// quant does.
func TestDecodeBlockMatchesQuant(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 1))
	for _, nf := range newBlockFmts {
		for it := 0; it < 200; it++ {
			k := randFmtBlocks(r, nf.f, 1, 1, blockFmtBytes[nf.f])
			var x [32]float32
			decodeBlock(nf.f, k, &x)
			want := make([]float32, 32)
			if err := quant.Dequantize(nf.q, k, want); err != nil {
				t.Fatal(err)
			}
			for j := range want {
				if x[j] != want[j] {
					t.Fatalf("%s: element %d = %g, quant %g", blockFmtNames[nf.f], j, x[j], want[j])
				}
			}
		}
	}
}

// TestBlockAttnFormats holds every instruction set's q4_1, q5_0, q5_1 and
// iq4_nl scoring and mixing against the references, on odd row counts
// (not multiples of any unroll), strides and block counts.
func TestBlockAttnFormats(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, isa := range ISAs() {
		o, _ := ForISA(isa)
		for _, nf := range newBlockFmts {
			bb := blockFmtBytes[nf.f]
			got, ref := nf.attn(o), blockRef(nf.f)
			for _, n := range []int{0, 1, 3, 17, 64} {
				for _, nb := range []int{1, 2, 3, 5} {
					for _, pad := range []int{0, 5} {
						stride := nb*bb + pad
						k := randFmtBlocks(r, nf.f, n, nb, stride)
						q := make([]float32, nb*32)
						for i := range q {
							q[i] = float32(r.NormFloat64())
						}
						s, sr := make([]float32, n), make([]float32, n)
						got.Scores(s, q, k, stride)
						ref.Scores(sr, q, k, stride)
						for i := range s {
							x := make([]float32, len(q))
							axpyBlocksRef(nf.f, x, 1, k[i*stride:i*stride+nb*bb])
							var abs float64
							for j := range q {
								abs += math.Abs(float64(q[j] * x[j]))
							}
							if d := math.Abs(float64(s[i] - sr[i])); d > 1e-5*abs+1e-5 || math.IsNaN(float64(s[i])) {
								t.Fatalf("%s %s n %d nb %d: score %d = %g, reference %g", isa, blockFmtNames[nf.f], n, nb, i, s[i], sr[i])
							}
						}
						w := make([]float32, n)
						for i := range w {
							w[i] = float32(r.Float64())
						}
						out, outr := make([]float32, nb*32), make([]float32, nb*32)
						for i := range out {
							out[i] = float32(r.NormFloat64())
							outr[i] = out[i]
						}
						got.Mix(out, w, k, stride)
						ref.Mix(outr, w, k, stride)
						for i := range out {
							if d := math.Abs(float64(out[i] - outr[i])); d > 1e-4*(1+math.Abs(float64(outr[i]))) {
								t.Fatalf("%s %s n %d nb %d: mix %d = %g, reference %g", isa, blockFmtNames[nf.f], n, nb, i, out[i], outr[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestBlockAttnFormatsBadLayout: the new formats' kernels check rows too.
func TestBlockAttnFormatsBadLayout(t *testing.T) {
	for _, nf := range newBlockFmts {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: a row past the end did not panic", blockFmtNames[nf.f])
				}
			}()
			bb := blockFmtBytes[nf.f]
			nf.attn(Best()).Mix(make([]float32, 32), make([]float32, 2), make([]byte, bb+3), bb)
		}()
	}
}

// TestAttnISAs: this machine's instruction sets are all tested; on an
// AVX-512 CPU the AVX2 kernels run too.
func TestAttnISAs(t *testing.T) {
	t.Logf("instruction sets under test: %v", ISAs())
}
