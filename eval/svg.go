package eval

import (
	"fmt"
	"html"
	"io"
	"math"
)

// WriteSVG plots the report: one point per configuration, KV bytes per
// token across, mean KL(exact ‖ config) up a log axis (a KL of 0, the
// exact format, sits on the floor), so the trade-off reads at a glance.
func WriteSVG(w io.Writer, rep *Report, title string) error {
	const W, H, L, R, T, B = 720, 440, 80, 30, 40, 60
	floor := 1e-9
	xmax, ymin, ymax := 0.0, math.Inf(1), math.Inf(-1)
	for _, r := range rep.Results {
		xmax = max(xmax, r.BytesPerToken)
		if r.KLMean > 0 {
			ymin, ymax = min(ymin, r.KLMean), max(ymax, r.KLMean)
		}
	}
	if math.IsInf(ymin, 1) {
		ymin, ymax = floor, 1
	}
	lo, hi := math.Floor(math.Log10(ymin))-1, math.Ceil(math.Log10(ymax))
	if hi <= lo {
		hi = lo + 1
	}
	xmax *= 1.1
	if xmax == 0 {
		xmax = 1
	}
	px := func(x float64) float64 { return L + x/xmax*(W-L-R) }
	py := func(y float64) float64 {
		ly := lo
		if y > 0 {
			ly = math.Max(math.Log10(y), lo)
		}
		return H - B - (ly-lo)/(hi-lo)*(H-T-B)
	}
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="24" font-size="15">%s</text>`+"\n", L, html.EscapeString(title))
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", L, H-B, W-R, H-B)
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", L, T, L, H-B)
	for e := lo; e <= hi; e++ {
		y := py(math.Pow(10, e))
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">1e%d</text>`+"\n", L, y, W-R, y, L-6, y+4, int(e))
	}
	for i := 0; i <= 5; i++ {
		x := xmax * float64(i) / 5
		p(`<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n", px(x), H-B+16, x)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">KV bytes per token</text>`+"\n", (L+W-R)/2, H-B+38)
	p(`<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">mean KL(exact ‖ config), nats</text>`+"\n", (T+H-B)/2)
	for _, r := range rep.Results {
		x, y := px(r.BytesPerToken), py(r.KLMean)
		p(`<circle cx="%.1f" cy="%.1f" r="4" fill="#1f77b4"/><text x="%.1f" y="%.1f">%s</text>`+"\n", x, y, x+6, y-6, html.EscapeString(r.Name))
	}
	_, err := fmt.Fprintln(w, `</svg>`)
	return err
}
