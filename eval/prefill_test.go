package eval

import (
	"encoding/xml"
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestPrefill: with a prompt, the full cache's measurements are the plain
// run's over the same positions (the prompt pass computes the same
// logits up to float rounding), the f32 configuration is exact; SnapKV
// holding at least the prompt is exact too, while a small capacity
// compresses the prompt and loses something, which it never does without
// a prompt (one token per pass: no prompt to compress).
func TestPrefill(t *testing.T) {
	m, ids := openStories(t)
	const P = 48
	cfgs := mustParse(t, "f32", "snapkv:capacity=64", "snapkv:capacity=16,window=8", "h2o:heavy=8,recent=8")
	plain, err := Run(m, ids, cfgs, Options{PerPosition: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := Run(m, ids, cfgs, Options{Prefill: P, PerPosition: true})
	if err != nil {
		t.Fatal(err)
	}
	if pre.Prefill != P || len(pre.RefNLL) != len(ids)-P || len(plain.RefNLL) != len(ids)-1 {
		t.Fatalf("prefill %d, %d and %d positions for %d tokens", pre.Prefill, len(pre.RefNLL), len(plain.RefNLL), len(ids))
	}
	var tail float64
	for i, v := range plain.RefNLL[P-1:] {
		tail += v
		if math.Abs(v-pre.RefNLL[i]) > 1e-4 {
			t.Errorf("position %d: NLL %g with a prompt, %g without", P+i, pre.RefNLL[i], v)
		}
	}
	f32 := byName(t, pre, "f32")
	if want := math.Exp(tail / float64(len(ids)-P)); f32.KLMean != 0 || f32.Top1 != 1 || f32.PPL != f32.RefPPL || math.Abs(f32.PPL-want) > 1e-4*want {
		t.Errorf("f32 with a prompt: %+v, want exact with ppl %g", f32, want)
	}
	if f32.Positions != len(ids)-P {
		t.Errorf("%d positions measured, want %d", f32.Positions, len(ids)-P)
	}
	big, small := byName(t, pre, "snapkv:capacity=64"), byName(t, pre, "snapkv:capacity=16,window=8")
	t.Logf("with a %d-token prompt: snapkv 64 KL %g, snapkv 16 KL %.4g, h2o 8+8 KL %.4g", P, big.KLMean, small.KLMean, byName(t, pre, "h2o:heavy=8,recent=8").KLMean)
	if big.KLMean != 0 || big.Top1 != 1 {
		t.Errorf("snapkv with room for the prompt: KL %g, top-1 %g", big.KLMean, big.Top1)
	}
	if !(small.KLMean > 1e-3) {
		t.Errorf("snapkv capacity 16 of a %d-token prompt: KL %g", P, small.KLMean)
	}
	if p := byName(t, plain, "snapkv:capacity=16,window=8"); p.KLMean != 0 {
		t.Errorf("snapkv without a prompt compressed: KL %g", p.KLMean)
	}
	if small.Budget != 16 || small.Series != "snapkv:window=8" || big.Series != "snapkv" {
		t.Errorf("budget %d, series %q and %q", small.Budget, small.Series, big.Series)
	}
	// Segments of 40 with a 30-token prompt: the last, shorter than 31
	// tokens, is left out.
	seg, err := Run(m, ids, cfgs[:1], Options{Prefill: 30, Segment: 40})
	if err != nil {
		t.Fatal(err)
	}
	if full := len(ids) / 40; seg.Segments != full+btoi(len(ids)%40 > 30) || seg.Results[0].Positions != 10*full+max(0, len(ids)%40-30) {
		t.Errorf("%d tokens in segments of 40, prompts of 30: %d segments, %d positions", len(ids), seg.Segments, seg.Results[0].Positions)
	}
	if _, err := Run(m, ids, cfgs[:1], Options{Prefill: len(ids)}); err == nil {
		t.Error("a prompt of the whole text accepted")
	}
}

// TestSinkMass: the exact run's attention on the first tokens is a
// fraction per layer, the uniform spread is 4 over the positions seen,
// and measuring it leaves the exact computation alone.
func TestSinkMass(t *testing.T) {
	m, ids := openStories(t)
	cfgs := mustParse(t, "f32")
	rep, err := Run(m, ids, cfgs, Options{SinkTokens: 4, SinkFrom: 32})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Sinks
	if s == nil || len(s.Mass) != m.Config.NLayer || s.Tokens != 4 || s.From != 32 {
		t.Fatalf("sinks %+v", s)
	}
	// Queries at 32..n-1 see pos+1 positions: the uniform share is the
	// mean of 4/(pos+1).
	var u float64
	for p := 32; p < len(ids); p++ {
		u += 4 / float64(p+1)
	}
	if u /= float64(len(ids) - 32); math.Abs(s.Uniform-u) > 1e-9 {
		t.Errorf("uniform %g, want %g", s.Uniform, u)
	}
	for l, v := range s.Mass {
		if !(v > 0 && v < 1) {
			t.Errorf("layer %d: mass %g", l, v)
		}
	}
	if f := byName(t, rep, "f32"); f.KLMean != 0 || f.PPL != f.RefPPL {
		t.Errorf("f32 against the observed exact run: %+v", f)
	}
}

// TestLayouts: MiniCache and key channels lay out the cache: keeping
// every key channel is exact and takes the full bytes; fewer channels
// and merged layers save bytes and lose something, more the earlier
// MiniCache starts.
func TestLayouts(t *testing.T) {
	m, ids := openStories(t)
	rep, err := Run(m, ids, mustParse(t, "channels:r=8", "channels:r=4", "minicache:from=1", "minicache:from=3"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	all, half := byName(t, rep, "channels:r=8"), byName(t, rep, "channels:r=4")
	mc1, mc3 := byName(t, rep, "minicache:from=1"), byName(t, rep, "minicache:from=3")
	t.Logf("channels 8: KL %g, %g B/token; 4: KL %.4g, %g B/token; minicache from 1: KL %.4g, %g; from 3: KL %.4g, %g; exact %g B/token",
		all.KLMean, all.BytesPerToken, half.KLMean, half.BytesPerToken, mc1.KLMean, mc1.BytesPerToken, mc3.KLMean, mc3.BytesPerToken, rep.RefBytesTok)
	if all.KLMean != 0 || all.BytesPerToken != rep.RefBytesTok {
		t.Errorf("every channel kept: KL %g, %g B/token against %g", all.KLMean, all.BytesPerToken, rep.RefBytesTok)
	}
	if !(half.KLMean > 0) || math.Abs(half.BytesPerToken-0.75*rep.RefBytesTok) > 1e-9*rep.RefBytesTok {
		t.Errorf("half the key channels: KL %g, %g B/token, want > 0 and 3/4 of %g", half.KLMean, half.BytesPerToken, rep.RefBytesTok)
	}
	if !(mc3.KLMean > 0 && mc1.KLMean > mc3.KLMean && mc1.BytesPerToken < mc3.BytesPerToken && mc3.BytesPerToken < rep.RefBytesTok) {
		t.Errorf("minicache from 1: KL %g, %g B/token; from 3: KL %g, %g B/token", mc1.KLMean, mc1.BytesPerToken, mc3.KLMean, mc3.BytesPerToken)
	}
	if mc1.Series != "minicache" || half.Series != "channels" {
		t.Errorf("series %q, %q", mc1.Series, half.Series)
	}
	for _, bad := range []string{"channels:r=0", "channels:r=2,x=1", "minicache:from=1,t=2"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
	if _, err := Run(m, ids, mustParse(t, "channels:r=9"), Options{}); err == nil {
		t.Error("9 channels of 8 accepted")
	}
	if _, err := Run(m, ids, mustParse(t, "minicache:from=4"), Options{}); err == nil {
		t.Error("minicache from the last layer accepted")
	}
}

// svgDoc is what the plot tests read back from the SVG.
type svgDoc struct {
	XMLName xml.Name `xml:"svg"`
	Series  []struct {
		Class    string `xml:"class,attr"`
		Name     string `xml:"data-name,attr"`
		Polyline struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Circles []struct{} `xml:"circle"`
		Texts   []string   `xml:"text"`
	} `xml:"g"`
}

func parseSVG(t *testing.T, s string) svgDoc {
	t.Helper()
	var d svgDoc
	if err := xml.Unmarshal([]byte(s), &d); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	return d
}

// TestPlots: the SVG writers' output is XML with one series group per
// line, as many polyline points (and markers) as the input has points,
// names escaped.
func TestPlots(t *testing.T) {
	rep := &Report{RefBytesTok: 1280, Prefill: 0, RefNLL: make([]float64, 100), Results: []Result{
		{Name: "quest:budget=64", Series: "quest", Budget: 64, KLMean: 0.1, BytesPerToken: 1280, NLL: make([]float64, 100)},
		{Name: "quest:budget=128", Series: "quest", Budget: 128, KLMean: 0.05, BytesPerToken: 1280, NLL: make([]float64, 100)},
		{Name: "quest:budget=256", Series: "quest", Budget: 256, KLMean: 0, BytesPerToken: 1280, NLL: make([]float64, 100)},
		{Name: "h2o <64>", Series: "h2o & co", Budget: 64, KLMean: 0.2, BytesPerToken: 600, NLL: make([]float64, 100)},
		{Name: "f16", KLMean: 1e-6, BytesPerToken: 640, NLL: make([]float64, 100)},
	}}
	var b strings.Builder
	if err := WriteBudgetSVG(&b, rep, "budgets <x>"); err != nil {
		t.Fatal(err)
	}
	d := parseSVG(t, b.String())
	if len(d.Series) != 2 || d.Series[0].Name != "quest" || d.Series[1].Name != "h2o & co" {
		t.Fatalf("budget plot series: %+v", d.Series)
	}
	for i, want := range []int{3, 1} {
		s := d.Series[i]
		if s.Class != "series" || len(strings.Fields(s.Polyline.Points)) != want || len(s.Circles) != want {
			t.Errorf("series %q: points %q, %d markers, want %d", s.Name, s.Polyline.Points, len(s.Circles), want)
		}
	}
	// x ascends along the quest line.
	var last float64 = -1
	for _, pt := range strings.Fields(d.Series[0].Polyline.Points) {
		var x, y float64
		if _, err := fmtSscan(pt, &x, &y); err != nil || x <= last {
			t.Errorf("point %q after x %g", pt, last)
		}
		last = x
	}
	b.Reset()
	if err := WriteSVG(&b, rep, "bytes"); err != nil {
		t.Fatal(err)
	}
	if d := parseSVG(t, b.String()); len(d.Series) != 3 || len(d.Series[2].Circles) != 1 || d.Series[2].Name != "f16" {
		t.Errorf("bytes plot: %+v", d.Series)
	}
	b.Reset()
	if err := WriteSavedSVG(&b, rep, "saved"); err != nil {
		t.Fatal(err)
	}
	d = parseSVG(t, b.String())
	if len(d.Series) != 3 || len(d.Series[0].Circles) != 3 || len(d.Series[0].Texts) != 4 || d.Series[0].Texts[0] != "budget=64" {
		t.Errorf("saved plot: %+v", d.Series)
	}
	b.Reset()
	if err := WriteCurveSVG(&b, rep, "curve", 32); err != nil {
		t.Fatal(err)
	}
	d = parseSVG(t, b.String())
	if len(d.Series) != 6 || d.Series[0].Name != "exact (full cache)" {
		t.Fatalf("curve series: %+v", d.Series)
	}
	for _, s := range d.Series {
		if n := len(strings.Fields(s.Polyline.Points)); n != 3 || len(s.Circles) != 0 {
			t.Errorf("curve %q: %d points (100 positions in bins of 32: 3), %d markers", s.Name, n, len(s.Circles))
		}
	}
	x, y := Curve([]float64{0, 2, 1, 1, 5}, 2, 1, 0)
	if len(x) != 2 || x[0] != 2 || x[1] != 4 || y[0] != math.E || y[1] != math.E {
		t.Errorf("Curve: %v %v", x, y)
	}
	// Two segments of 4 measured positions and a partial third, folded.
	x, y = Curve([]float64{0, 2, 4, 4, 2, 0, 2, 2, 1}, 2, 1, 4)
	if len(x) != 2 || x[0] != 2 || x[1] != 4 || math.Abs(y[0]-math.E) > 1e-12 || math.Abs(y[1]-math.Exp(3)) > 1e-12 {
		t.Errorf("folded Curve: %v %v", x, y)
	}
	if err := (&Plot{Series: []Series{{Name: "bad", X: []float64{1}}}}).Write(&b); err == nil {
		t.Error("a series with fewer y than x plotted")
	}
}

func fmtSscan(pt string, x, y *float64) (int, error) {
	return fmt.Sscanf(pt, "%g,%g", x, y)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
