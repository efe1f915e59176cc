package sample

import "math"

// expNeg returns e^x for x <= 0. It exists because math.Exp has
// per-architecture assembly, and sampling must pick the same token for the
// same seed everywhere; it is also faster, which matters when the whole
// vocabulary is exponentiated every step. Products are wrapped in explicit
// float64 conversions so the compiler may not fuse them into FMAs (the spec
// allows fusion otherwise, and that changes the last bits).
//
// Method: x = (64k + j)·ln2/64 + r with |r| <= ln2/128, so
// e^x = 2^k · 2^(j/64) · e^r, with a table for 2^(j/64) and a degree-5
// Taylor polynomial for e^r (error < 1e-16 relative).
func expNeg(x float64) float64 {
	if !(x >= -708) { // also catches NaN
		return 0
	}
	if x > 0 {
		x = 0
	}
	const (
		invC = 92.33248261689366      // 64/ln2
		cHi  = 0.01083042469326756    // ln2/64, low bits cleared so n·cHi is exact
		cLo  = 2.9815858269852933e-12 // ln2/64 - cHi
	)
	n := int64(float64(x*invC) - 0.5) // x <= 0, truncation rounds to nearest
	fn := float64(n)
	r := x - float64(fn*cHi) - float64(fn*cLo)
	p := float64(r*(1.0/120)) + 1.0/24
	p = float64(p*r) + 1.0/6
	p = float64(p*r) + 0.5
	p = float64(p*r) + 1
	p = float64(p*r) + 1
	k := n >> 6 // floor division: n <= 0
	j := n & 63
	return float64(float64(p*exp2Table[j]) * math.Float64frombits(uint64(k+1023)<<52))
}

// exp2Table[j] = 2^(j/64), correctly rounded.
var exp2Table = [64]float64{
	1.0, 1.0108892860517005, 1.0218971486541166, 1.0330248790212284,
	1.0442737824274138, 1.0556451783605572, 1.0671404006768237, 1.0787607977571199,
	1.0905077326652577, 1.102382583307841, 1.1143867425958924, 1.1265216186082418,
	1.1387886347566916, 1.1511892299529827, 1.1637248587775775, 1.1763969916502812,
	1.189207115002721, 1.202156731452703, 1.215247359980469, 1.22848053610687,
	1.241857812073484, 1.255380757024691, 1.2690509571917332, 1.2828700160787783,
	1.2968395546510096, 1.3109612115247644, 1.3252366431597413, 1.339667524053303,
	1.3542555469368927, 1.3690024229745905, 1.383909881963832, 1.3989796725383112,
	1.4142135623730951, 1.42961333839197, 1.4451808069770467, 1.460917794180647,
	1.4768261459394993, 1.4929077282912648, 1.5091644275934228, 1.5255981507445384,
	1.5422108254079407, 1.559004400237837, 1.5759808451078865, 1.593142151342267,
	1.6104903319492543, 1.6280274218573478, 1.645755478153965, 1.6636765803267364,
	1.681792830507429, 1.7001063537185235, 1.718619298122478, 1.7373338352737062,
	1.7562521603732995, 1.7753764925265212, 1.7947090750031072, 1.8142521755003989,
	1.8340080864093424, 1.8539791250833855, 1.8741676341103, 1.8945759815869656,
	1.9152065613971474, 1.9360617934922943, 1.9571441241754002, 1.978456026387951,
}

// expNegShift writes e^(src[i]-m) into dst and returns their sum. It is
// expNeg with the body inlined by hand: the call overhead dominated when the
// whole vocabulary is exponentiated. Four partial sums break the serial
// dependency of one accumulator; the order of additions is fixed, so the
// result is still reproducible. Each element must stay bit-identical to
// expNeg.
func expNegShift(dst []float64, src []float32, m float32) float64 {
	const (
		invC = 92.33248261689366
		cHi  = 0.01083042469326756
		cLo  = 2.9815858269852933e-12
	)
	dst = dst[:len(src)]
	fm := float64(m)
	var acc [4]float64
	for i, l := range src {
		x := float64(l) - fm
		e := 0.0
		if x >= -708 {
			x = min(x, 0)
			n := int64(float64(x*invC) - 0.5)
			fn := float64(n)
			r := x - float64(fn*cHi) - float64(fn*cLo)
			p := float64(r*(1.0/120)) + 1.0/24
			p = float64(p*r) + 1.0/6
			p = float64(p*r) + 0.5
			p = float64(p*r) + 1
			p = float64(p*r) + 1
			e = float64(float64(p*exp2Table[n&63]) * math.Float64frombits(uint64((n>>6)+1023)<<52))
		}
		dst[i] = e
		acc[i&3] += e
	}
	return (acc[0] + acc[1]) + (acc[2] + acc[3])
}
