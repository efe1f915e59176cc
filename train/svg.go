package train

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// WriteSVG draws the loss history: the training loss (each step faint, a
// moving average over window steps solid) and the held-out loss (points
// joined), against tokens seen, with title as the heading.
func WriteSVG(w io.Writer, hist []Point, title string, window int) error {
	if len(hist) == 0 {
		return fmt.Errorf("train: no history to draw")
	}
	const W, H, left, right, top, bottom = 800, 480, 70, 20, 40, 50
	maxTok := float64(hist[len(hist)-1].Tokens)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range hist {
		lo, hi = math.Min(lo, p.Loss), math.Max(hi, p.Loss)
		if p.HasHeldOut {
			lo, hi = math.Min(lo, p.HeldOut), math.Max(hi, p.HeldOut)
		}
	}
	lo, hi = math.Floor(lo*2)/2, math.Ceil(hi*2)/2
	if hi <= lo {
		hi = lo + 1
	}
	if maxTok <= 0 {
		maxTok = 1
	}
	x := func(t int64) float64 { return left + float64(t)/maxTok*(W-left-right) }
	y := func(l float64) float64 { return top + (hi-l)/(hi-lo)*(H-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, escapeXML(title))
	// Axes and grid.
	for l := lo; l <= hi+1e-9; l += 0.5 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.1f</text>`+"\n",
			left, W-right, y(l), y(l), left-6, y(l)+4, l)
	}
	for i := 0; i <= 5; i++ {
		t := int64(maxTok * float64(i) / 5)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(t), x(t), top, H-bottom, x(t), H-bottom+16, tokenCount(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">tokens trained on</text>`+"\n", (W+left)/2, H-12)
	fmt.Fprintf(&b, `<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">cross-entropy (nats/token)</text>`+"\n", (H+top)/2, (H+top)/2)
	path := func(pts [][2]float64, style string) {
		if len(pts) == 0 {
			return
		}
		b.WriteString(`<polyline fill="none" ` + style + ` points="`)
		for _, p := range pts {
			fmt.Fprintf(&b, "%.1f,%.1f ", p[0], p[1])
		}
		b.WriteString("\"/>\n")
	}
	var raw, avg, held [][2]float64
	var sum float64
	for i, p := range hist {
		raw = append(raw, [2]float64{x(p.Tokens), y(p.Loss)})
		sum += p.Loss
		if i >= window {
			sum -= hist[i-window].Loss
		}
		avg = append(avg, [2]float64{x(p.Tokens), y(sum / float64(min(i+1, window)))})
		if p.HasHeldOut {
			held = append(held, [2]float64{x(p.Tokens), y(p.HeldOut)})
		}
	}
	path(raw, `stroke="#9bc" stroke-width="0.7"`)
	path(avg, `stroke="#1f5f9f" stroke-width="2"`)
	path(held, `stroke="#d2521e" stroke-width="2"`)
	for _, p := range held {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#d2521e"/>`+"\n", p[0], p[1])
	}
	lx := W - right - 230
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#1f5f9f" stroke-width="2"/><text x="%d" y="%d">training loss (mean of %d steps)</text>`+"\n",
		lx, lx+20, top+12, top+12, lx+26, top+16, window)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#d2521e" stroke-width="2"/><text x="%d" y="%d">held-out loss</text>`+"\n",
		lx, lx+20, top+30, top+30, lx+26, top+34)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func tokenCount(t int64) string {
	switch {
	case t >= 1e6:
		return fmt.Sprintf("%.1fM", float64(t)/1e6)
	case t >= 1e3:
		return fmt.Sprintf("%.0fk", float64(t)/1e3)
	}
	return fmt.Sprint(t)
}

func escapeXML(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
