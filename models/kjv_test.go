package models

import (
	"math"
	"os"
	"strings"
	"testing"

	"pagoda/generate"
	"pagoda/model"
	"pagoda/tokenizer"
)

// kjvBound is the held-out perplexity the shipped KJV model must stay
// under on the excerpt: measured 32.004 (amd64, AVX-512), plus about 5%
// for kernel differences between machines.
const kjvBound = 33.5

// TestKJVHeldOutPerplexity loads the shipped Q8_0 KJV model as `pagoda run`
// does and measures its perplexity on two 512-token windows of held-out
// chapters (never trained on).
func TestKJVHeldOutPerplexity(t *testing.T) {
	m, err := model.Open("kjv3m.q8_0.gguf", model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if c := m.Config; c.HeadDim < 32 || c.ContextLen < 512 {
		t.Errorf("head width %d, context %d: want ≥ 32 and ≥ 512", c.HeadDim, c.ContextLen)
	}
	text, err := os.ReadFile("kjv-heldout-excerpt.txt")
	if err != nil {
		t.Fatal(err)
	}
	tok := m.Tokenizer()
	ids := tok.Encode(string(text), tokenizer.Options{})
	if got := tok.Decode(ids); got != string(text) {
		t.Fatalf("the excerpt does not round-trip through the model's tokenizer")
	}
	const win = 512
	if len(ids) < 2*win {
		t.Fatalf("excerpt has %d tokens, want %d", len(ids), 2*win)
	}
	var nll float64
	var n int
	for w := 0; w < 2; w++ {
		sc, err := generate.ScoreTokens(m, ids[w*win:(w+1)*win], false, win)
		if err != nil {
			t.Fatal(err)
		}
		nll += sc.NLL
		n += win - 1
	}
	ppl := math.Exp(nll / float64(n))
	t.Logf("held-out perplexity %.3f over %d tokens (%.2f bytes/token)", ppl, n, float64(len(text))/float64(len(ids)))
	if !(ppl < kjvBound) {
		t.Errorf("held-out perplexity %.3f, want < %g", ppl, float64(kjvBound))
	}
	if strings.Count(string(text), "\n") == 0 {
		t.Fatal("excerpt is not the chapter text")
	}
}
