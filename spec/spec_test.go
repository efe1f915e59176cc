package spec

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pagoda/tokenizer"
)

func TestNGramMatch(t *testing.T) {
	g, err := NewNGram(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		toks  []int32
		at, n int
	}{
		{[]int32{1, 2, 3, 9, 1, 2, 3}, 3, 3},             // longest suffix 1 2 3 → 9 follows
		{[]int32{1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3}, 3, 3}, // 3-gram beats the later 2-gram
		{[]int32{5, 2, 3, 7, 6, 2, 3}, 3, 2},             // the 2-gram "2 3" occurred at 1..3
		{[]int32{4, 4, 4}, 2, 2},                         // overlapping runs propose the run
		{[]int32{1, 2, 3}, -1, 0},
		{[]int32{1}, -1, 0},
	}
	for _, c := range cases {
		at, n := g.Match(c.toks)
		if at != c.at || n != c.n {
			t.Errorf("Match(%v) = %d, %d; want %d, %d", c.toks, at, n, c.at, c.n)
		}
	}
	g2, _ := NewNGram(2, 3)
	if at, _ := g2.Match([]int32{7, 1, 9, 8, 1}); at != -1 {
		t.Errorf("min 2: a 1-gram matched at %d", at)
	}
	r := &Req{Tokens: []int32{10, 11, 12, 13, 14, 10, 11}, Max: 2}
	if err := g.Propose([]*Req{r}); err != nil || !slices.Equal(r.Draft, []int32{12, 13}) || len(r.Probs) != 0 {
		t.Fatalf("draft %v (%v)", r.Draft, err)
	}
	r = &Req{Tokens: []int32{10, 11, 12, 10, 11}, Max: 5} // the match's tail is short
	g.Propose([]*Req{r})
	if !slices.Equal(r.Draft, []int32{12, 10, 11}) {
		t.Fatalf("short tail: draft %v", r.Draft)
	}
	if _, err := NewNGram(3, 2); err == nil {
		t.Fatal("min > max accepted")
	}
}

// TestAcceptResidualExact checks the rule's output distribution exactly:
// summing over the draft x ~ q, the acceptance probability min(1, p/q) and
// the residual, every token's probability must be p's; a rule that
// accepts too often (min(1, 2p/q)) must not pass the same check.
func TestAcceptResidualExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const V = 7
	wrong := 0
	const trials = 20
	for trial := 0; trial < trials; trial++ {
		p, q := randDist(rng, V), randDist(rng, V)
		if trial%5 == 0 {
			q[trial%V], p[(trial+1)%V] = 0, 0 // zeros on either side
			norm(p)
			norm(q)
		}
		got := outDist(p, q, func(p, q []float32, x int32, u float64) bool { return Accept(p, q, x, u) })
		bad := outDist(p, q, func(p, q []float32, x int32, u float64) bool { return u*float64(q[x]) < 2*float64(p[x]) })
		var worst, worstBad float64
		for i := range p {
			worst = max(worst, math.Abs(got[i]-float64(p[i])))
			worstBad = max(worstBad, math.Abs(bad[i]-float64(p[i])))
		}
		if worst > 2e-3 {
			t.Fatalf("trial %d: output %v, want p %v", trial, got, p)
		}
		if worstBad > 1e-2 {
			wrong++
		}
	}
	if wrong < trials/2 {
		t.Fatalf("the check caught a wrong rule in only %d of %d trials", wrong, trials)
	}
}

// outDist integrates the rule over x ~ q and the two uniforms (on a fine
// grid), giving the output distribution.
func outDist(p, q []float32, accept func(p, q []float32, x int32, u float64) bool) []float64 {
	const grid, rgrid = 1000, 100000
	resid := make([]float64, len(p)) // Residual's distribution, on a finer grid
	for k := 0; k < rgrid; k++ {
		resid[Residual(p, q, (float64(k)+0.5)/rgrid)] += 1.0 / rgrid
	}
	out := make([]float64, len(p))
	for x := range q {
		for k := 0; k < grid; k++ {
			u := (float64(k) + 0.5) / grid
			if accept(p, q, int32(x), u) {
				out[x] += float64(q[x]) / grid
				continue
			}
			for j, r := range resid {
				out[j] += float64(q[x]) / grid * r
			}
		}
	}
	return out
}

func randDist(rng *rand.Rand, n int) []float32 {
	p := make([]float32, n)
	for i := range p {
		p[i] = float32(rng.ExpFloat64())
	}
	norm(p)
	return p
}

func norm(p []float32) {
	var s float32
	for _, v := range p {
		s += v
	}
	for i := range p {
		p[i] /= s
	}
}

func TestExpectedTokensAndAcceptance(t *testing.T) {
	if got := ExpectedTokens(0.5, 3); math.Abs(got-1.875) > 1e-12 {
		t.Fatalf("E(0.5, 3) = %v", got)
	}
	if got := ExpectedTokens(1, 4); got != 5 {
		t.Fatalf("E(1, 4) = %v", got)
	}
	var a Acceptance
	if a.Rate() != 0.5 {
		t.Fatalf("prior %v", a.Rate())
	}
	for range 50 {
		a.Observe(4, 4)
	}
	hi := a.Rate()
	for range 50 {
		a.Observe(4, 0)
	}
	if hi < 0.9 || a.Rate() > 0.2 {
		t.Fatalf("rate after full acceptance %v, after none %v", hi, a.Rate())
	}
}

// TestCostGamma: memory-bound steps (large fixed cost) make drafts pay;
// compute-bound ones (cost proportional to tokens) do not.
func TestCostGamma(t *testing.T) {
	var c Cost
	seen := map[int]bool{}
	for range 6 {
		seen[c.Gamma(0.8, 1, 1, 5)] = true
	}
	if len(seen) != 6 {
		t.Fatalf("unfitted cost: γ took the values %v, want each of 0..5 to explore", seen)
	}
	for i := range 40 {
		n := 1 + i%8
		c.ObserveStep(n, 0.010+0.0005*float64(n)) // a = 10ms, b = 0.5ms
	}
	a, b, ok := c.Line()
	if !ok || math.Abs(a-0.010) > 1e-6 || math.Abs(b-0.0005) > 1e-7 {
		t.Fatalf("fit a=%v b=%v ok=%v", a, b, ok)
	}
	if g := c.Gamma(0.8, 1, 1, 8); g != 8 {
		t.Fatalf("memory-bound, α 0.8: γ %d", g)
	}
	if g := c.Gamma(0.02, 1, 1, 8); g != 0 {
		t.Fatalf("α 0.02: γ %d", g)
	}
	var cb Cost
	for i := range 40 {
		n := 32 + i%8
		cb.ObserveStep(n, 0.001*float64(n)) // no fixed cost
	}
	if g := cb.Gamma(0.8, 32, 32, 8); g != 0 {
		t.Fatalf("compute-bound: γ %d", g)
	}
	// A draft that costs as much per token as a target step never pays.
	c.ObserveDraft(1, 0.0105)
	if g := c.Gamma(0.9, 1, 1, 8); g != 0 {
		t.Fatalf("slow draft: γ %d", g)
	}
}

func TestCheckVocab(t *testing.T) {
	mk := func(n int) *tokenizer.Vocab {
		v := &tokenizer.Vocab{Model: "llama", BOS: 1, EOS: 2, AddBOS: true}
		for i := range n {
			v.Tokens = append(v.Tokens, string(rune('a'+i%26))+string(rune('0'+i/26%10)))
		}
		return v
	}
	tgt := mk(300)
	if err := CheckVocab(tgt, mk(300)); err != nil {
		t.Fatal(err)
	}
	if err := CheckVocab(tgt, mk(250)); err != nil {
		t.Fatalf("a small tail difference: %v", err)
	}
	for name, f := range map[string]func(v *tokenizer.Vocab){
		"type":  func(v *tokenizer.Vocab) { v.Model = "gpt2" },
		"BOS":   func(v *tokenizer.Vocab) { v.BOS = 0 },
		"add":   func(v *tokenizer.Vocab) { v.AddBOS = false },
		"size":  func(v *tokenizer.Vocab) { v.Tokens = v.Tokens[:100] },
		"token": func(v *tokenizer.Vocab) { v.Tokens[42] = "zz" },
	} {
		d := mk(300)
		f(d)
		err := CheckVocab(tgt, d)
		if err == nil || !strings.HasPrefix(err.Error(), "spec: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
