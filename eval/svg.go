package eval

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// Series is one line of a Plot: points (X[i], Y[i]), drawn in order.
type Series struct {
	Name   string
	X, Y   []float64
	Labels []string // optional, one per point: written beside its marker
}

// Plot is a line chart written as plain SVG: every series is a
// <g class="series"> holding one <polyline> through its points (and,
// with Markers, a <circle> per point), named in a legend. With LogY the
// y axis is logarithmic and values at or below zero sit on its floor.
type Plot struct {
	Title, XLabel, YLabel string
	LogY, Markers         bool
	Series                []Series
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Write writes the plot as an SVG document.
func (pl *Plot) Write(w io.Writer) error {
	const W, H, L, R, T, B = 860, 460, 80, 290, 40, 60
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	floor := false // a value to put on the log axis's floor
	for _, s := range pl.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("eval: plot series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		for i, x := range s.X {
			xmin, xmax = min(xmin, x), max(xmax, x)
			if y := s.Y[i]; !pl.LogY || y > 0 {
				ymin, ymax = min(ymin, y), max(ymax, y)
			} else {
				floor = true
			}
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax = 0, 1
	}
	if xmax <= xmin {
		xmin, xmax = xmin-1, xmax+1
	}
	var lo, hi float64 // y axis range (decades with LogY)
	if pl.LogY {
		if math.IsInf(ymin, 1) {
			ymin, ymax = 1e-9, 1
		}
		lo, hi = math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if floor {
			lo--
		}
		if hi <= lo {
			hi = lo + 1
		}
	} else {
		if math.IsInf(ymin, 1) {
			ymin, ymax = 0, 1
		}
		lo, hi = min(0, ymin), ymax*1.05
		if ymin > 0 && ymin > ymax/4 {
			lo = ymin * 0.9 // a narrow range of positive values fills the axis
		}
		if hi <= lo {
			hi = lo + 1
		}
	}
	px := func(x float64) float64 { return L + (x-xmin)/(xmax-xmin)*(W-L-R) }
	py := func(y float64) float64 {
		v := y
		if pl.LogY {
			v = lo
			if y > 0 {
				v = math.Max(math.Log10(y), lo)
			}
		}
		return H - B - (v-lo)/(hi-lo)*(H-T-B)
	}
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	esc := html.EscapeString
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="24" font-size="15">%s</text>`+"\n", L, esc(pl.Title))
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", L, H-B, W-R, H-B)
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", L, T, L, H-B)
	if pl.LogY {
		for e := lo; e <= hi; e++ {
			y := py(math.Pow(10, e))
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">1e%d</text>`+"\n", L, y, W-R, y, L-6, y+4, int(e))
		}
	} else {
		step := niceStep(hi - lo)
		for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
			y := py(v)
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.4g</text>`+"\n", L, y, W-R, y, L-6, y+4, v)
		}
	}
	step := niceStep(xmax - xmin)
	for x := math.Ceil(xmin/step) * step; x <= xmax+step*1e-9; x += step {
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/><text x="%.1f" y="%d" text-anchor="middle">%.4g</text>`+"\n", px(x), H-B, px(x), H-B+4, px(x), H-B+16, x)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (L+W-R)/2, H-B+38, esc(pl.XLabel))
	p(`<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (T+H-B)/2, esc(pl.YLabel))
	for si, s := range pl.Series {
		col := palette[si%len(palette)]
		p(`<g class="series" data-name="%s">`+"\n", esc(s.Name))
		p(`<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, col)
		for i := range s.X {
			if i > 0 {
				p(" ")
			}
			p("%.1f,%.1f", px(s.X[i]), py(s.Y[i]))
		}
		p(`"/>` + "\n")
		if pl.Markers {
			for i := range s.X {
				p(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(s.X[i]), py(s.Y[i]), col)
				if i < len(s.Labels) && s.Labels[i] != "" {
					p(`<text x="%.1f" y="%.1f" font-size="10" fill="%s">%s</text>`+"\n", px(s.X[i])+5, py(s.Y[i])-6, col, esc(s.Labels[i]))
				}
			}
		}
		ly := T + 10 + 18*si
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d" font-size="11">%s</text>`+"\n", W-R+10, ly, W-R+30, ly, col, W-R+36, ly+4, esc(s.Name))
		p("</g>\n")
	}
	_, err := fmt.Fprintln(w, `</svg>`)
	return err
}

// niceStep is a tick spacing of 1, 2 or 5 times a power of ten giving
// about five ticks over span.
func niceStep(span float64) float64 {
	raw := span / 5
	e := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*e >= raw {
			return m * e
		}
	}
	return 10 * e
}

// bySeries groups results by their series label (Result.Series, else the
// name) in order of first appearance, each sorted by x.
func bySeries(rs []Result, x func(Result) float64, y func(Result) float64) []Series {
	var out []Series
	idx := map[string]int{}
	for _, r := range rs {
		name := cmp.Or(r.Series, r.Name)
		i, ok := idx[name]
		if !ok {
			i, idx[name] = len(out), len(out)
			out = append(out, Series{Name: name})
		}
		out[i].X, out[i].Y = append(out[i].X, x(r)), append(out[i].Y, y(r))
		label := ""
		if r.Name != name {
			label = strings.TrimPrefix(r.Name, name+":")
		}
		out[i].Labels = append(out[i].Labels, label)
	}
	for i := range out {
		s := &out[i]
		ord := make([]int, len(s.X))
		for j := range ord {
			ord[j] = j
		}
		slices.SortStableFunc(ord, func(a, b int) int { return cmp.Compare(s.X[a], s.X[b]) })
		x, y, l := make([]float64, len(ord)), make([]float64, len(ord)), make([]string, len(ord))
		for j, k := range ord {
			x[j], y[j], l[j] = s.X[k], s.Y[k], s.Labels[k]
		}
		s.X, s.Y, s.Labels = x, y, l
	}
	return out
}

// WriteSVG plots the report: mean KL(exact ‖ config) up a log axis (a KL
// of 0, the exact format, sits on the floor) against KV bytes per token,
// one line per series (configurations differing only in a budget or a
// layer, MiniCache's start layer or the key channels kept, share one), so
// the trade-off reads at a glance.
func WriteSVG(w io.Writer, rep *Report, title string) error {
	pl := &Plot{Title: title, XLabel: "KV bytes per token (exact f32: " + fmt.Sprintf("%.0f", rep.RefBytesTok) + ")",
		YLabel: "mean KL(exact ‖ config), nats", LogY: true, Markers: true,
		Series: bySeries(rep.Results, func(r Result) float64 { return r.BytesPerToken }, func(r Result) float64 { return r.KLMean })}
	return pl.Write(w)
}

// WriteSavedSVG plots mean KL against the KV memory saved, in percent of
// the exact cache's bytes per token, one line per series with every point
// labelled by its setting (MiniCache's start layer, the channels kept).
func WriteSavedSVG(w io.Writer, rep *Report, title string) error {
	pl := &Plot{Title: title, XLabel: fmt.Sprintf("KV memory saved, %% of the exact cache's %.0f bytes per token", rep.RefBytesTok),
		YLabel: "mean KL(exact ‖ config), nats", LogY: true, Markers: true,
		Series: bySeries(rep.Results, func(r Result) float64 { return 100 * (1 - r.BytesPerToken/rep.RefBytesTok) }, func(r Result) float64 { return r.KLMean })}
	return pl.Write(w)
}

// WriteBudgetSVG plots mean KL against the token budget of every
// budgeted configuration (Result.Budget > 0), one line per series.
func WriteBudgetSVG(w io.Writer, rep *Report, title string) error {
	var rs []Result
	for _, r := range rep.Results {
		if r.Budget > 0 {
			rs = append(rs, r)
		}
	}
	pl := &Plot{Title: title, XLabel: "token budget (tokens a query attends)", YLabel: "mean KL(exact ‖ config), nats", LogY: true, Markers: true,
		Series: bySeries(rs, func(r Result) float64 { return float64(r.Budget) }, func(r Result) float64 { return r.KLMean })}
	for i := range pl.Series {
		pl.Series[i].Labels = nil // the budget is the x axis
	}
	return pl.Write(w)
}

// Curve is the perplexity over consecutive bins of bin measured
// positions: x is the index in the text of the bin's last predicted
// token, y exp(mean NLL over the bin); first is the index of the first
// measured token. With period > 0 the positions are folded first: the
// NLL at measured position i is averaged into slot i mod period (the
// segments of a run, each a fresh stream, averaged position by position).
// A last partial bin is dropped.
func Curve(nll []float64, bin, first, period int) (x, y []float64) {
	bin = max(bin, 1)
	if period > 0 && period < len(nll) {
		sum, n := make([]float64, period), make([]float64, period)
		for i, v := range nll {
			sum[i%period] += v
			n[i%period]++
		}
		for i := range sum {
			sum[i] /= n[i]
		}
		nll = sum
	}
	for lo := 0; lo+bin <= len(nll); lo += bin {
		var s float64
		for _, v := range nll[lo : lo+bin] {
			s += v
		}
		x, y = append(x, float64(first+lo+bin-1)), append(y, math.Exp(s/float64(bin)))
	}
	return x, y
}

// WriteCurveSVG plots, for the exact cache and every configuration, the
// perplexity over bins of bin positions against position (the report must
// come from a run with Options.PerPosition); several segments are
// averaged position by position.
func WriteCurveSVG(w io.Writer, rep *Report, title string, bin int) error {
	first := max(rep.Prefill, 1)
	period := 0
	if rep.Segments > 1 {
		period = rep.Segment - first
	}
	pl := &Plot{Title: title, XLabel: fmt.Sprintf("position of the predicted token (bins of %d)", bin),
		YLabel: fmt.Sprintf("perplexity over %d tokens", bin)}
	if rep.Segments > 1 {
		pl.XLabel += fmt.Sprintf(", mean of %d segments", rep.Segments)
	}
	x, y := Curve(rep.RefNLL, bin, first, period)
	pl.Series = append(pl.Series, Series{Name: "exact (full cache)", X: x, Y: y})
	for _, r := range rep.Results {
		x, y := Curve(r.NLL, bin, first, period)
		pl.Series = append(pl.Series, Series{Name: r.Name, X: x, Y: y})
	}
	// A log axis once the perplexities span more than a factor of 20.
	lo, hi := math.Inf(1), 0.0
	for _, s := range pl.Series {
		for _, v := range s.Y {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	pl.LogY = hi > 20*lo
	return pl.Write(w)
}
