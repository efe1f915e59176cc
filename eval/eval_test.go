package eval

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/synth"
	"pagoda/testutil"
	"pagoda/tokenizer"
)

const story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. " +
	"One day, she saw a big dog in the park. The dog was very friendly and wanted to play with her. " +
	"Lily was happy and they played all day. At the end of the day, Lily went home and told her mom about the dog."

func openStories(t *testing.T) (*model.Model, []int32) {
	t.Helper()
	m, err := model.Open(testutil.Shared(t, "models/gguf/stories260K.gguf"), model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, m.Tokenizer().Encode(story, tokenizer.Options{AddSpecial: true})
}

func mustParse(t *testing.T, names ...string) []Config {
	t.Helper()
	var cs []Config
	for _, n := range names {
		c, err := Parse(n)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

func byName(t *testing.T, rep *Report, name string) Result {
	t.Helper()
	for _, r := range rep.Results {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no result %q", name)
	return Result{}
}

// TestStoriesFloat: on stories260K the f32 configuration is the exact
// computation (KL exactly 0, every argmax equal, the same perplexity);
// f16 and bf16 lose a little, bf16 (8 mantissa bits) more than f16 (11),
// and each stores a token in half of f32's bytes.
func TestStoriesFloat(t *testing.T) {
	m, ids := openStories(t)
	rep, err := Run(m, ids, mustParse(t, "f32", "f16", "bf16"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	f32, f16, bf16 := byName(t, rep, "f32"), byName(t, rep, "f16"), byName(t, rep, "bf16")
	if f32.KLMean != 0 || f32.KLMax != 0 || f32.Top1 != 1 || f32.PPL != f32.RefPPL {
		t.Errorf("f32 is not exact: %+v", f32)
	}
	if f32.Positions != len(ids)-1 {
		t.Errorf("%d positions compared, want %d", f32.Positions, len(ids)-1)
	}
	if !(f16.KLMean > 0 && f16.KLMean < 1e-4 && bf16.KLMean > f16.KLMean && bf16.KLMean < 1e-2) {
		t.Errorf("KL f16 %g, bf16 %g: want 0 < f16 < 1e-4, f16 < bf16 < 1e-2", f16.KLMean, bf16.KLMean)
	}
	if f16.Top1 < 0.95 || math.Abs(f16.PPL-f16.RefPPL) > 1e-2*f16.RefPPL {
		t.Errorf("f16: top-1 %g, ppl %g against %g", f16.Top1, f16.PPL, f16.RefPPL)
	}
	if f16.BytesPerToken*2 != f32.BytesPerToken || f16.PeakBytes*2 != f32.PeakBytes {
		t.Errorf("bytes/token f16 %g (peak %d), f32 %g (peak %d)", f16.BytesPerToken, f16.PeakBytes, f32.BytesPerToken, f32.PeakBytes)
	}
	c := m.Config
	// The whole text fits one 16-token block more than its length needs.
	blocks := (len(ids) + 15) / 16
	if want := int64(blocks * 16 * 2 * c.NLayer * c.NKVHead * c.HeadDim * 4); f32.PeakBytes != want {
		t.Errorf("f32 peak %d bytes, want %d", f32.PeakBytes, want)
	}
	if rep.Results[0].TokensPerSec <= 0 {
		t.Error("no speed measured")
	}
}

// TestBlockFormatsOrder: on a model whose heads are 32 wide (stories260K's
// are 8, too narrow for a 32-element block), q8_0 loses something and
// q4_0 loses more, and their bytes are 8.5/32 and 4.5/32 of f32's.
func TestBlockFormatsOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	err := synth.Write(path, synth.Options{Seed: 3, Std: 0.08, Shape: synth.Shape{Arch: "llama", Layers: 2, Dim: 128,
		Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256, Vocab: 320, Context: 128, RopeTheta: 10000, RMSEps: 1e-5}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := make([]int32, 96)
	for i := range ids {
		ids[i] = int32((i*37+i*i)%300) + 3
	}
	rep, err := Run(m, ids, mustParse(t, "f32", "q8_0", "q4_0", "kv:k=q4_0,v=q8_0"), Options{Chunk: 5})
	if err != nil {
		t.Fatal(err)
	}
	f32, q8, q4, mixed := byName(t, rep, "f32"), byName(t, rep, "q8_0"), byName(t, rep, "q4_0"), byName(t, rep, "kv:k=q4_0,v=q8_0")
	t.Logf("KL q8_0 %.3g q4_0 %.3g k=q4_0,v=q8_0 %.3g", q8.KLMean, q4.KLMean, mixed.KLMean)
	if f32.KLMean != 0 || f32.Top1 != 1 {
		t.Errorf("f32: %+v", f32)
	}
	if !(q8.KLMean > 0 && q4.KLMean > 4*q8.KLMean) {
		t.Errorf("KL q8_0 %g, q4_0 %g: want 0 < q8_0 and q4_0 > 4×q8_0", q8.KLMean, q4.KLMean)
	}
	if mixed.KFormat != "q4_0" || mixed.VFormat != "q8_0" || !(mixed.KLMean > q8.KLMean) {
		t.Errorf("mixed: %+v", mixed)
	}
	for _, c := range []struct {
		r   Result
		num float64
	}{{q8, 8.5}, {q4, 4.5}, {mixed, 6.5}} {
		if got, want := c.r.BytesPerToken, f32.BytesPerToken*c.num/32; math.Abs(got-want) > 1e-9*want {
			t.Errorf("%s: %g bytes/token, want %g", c.r.Name, got, want)
		}
	}
}

func TestParse(t *testing.T) {
	c, err := Parse("kv:k=q4_0,v=f16+block:n=32")
	if err != nil || c.Setup.KFormat != kvcache.Q4_0 || c.Setup.VFormat != kvcache.F16 || c.Setup.BlockSize != 32 {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{"", "q9_0", "kv:k=q4_0,w=f16", "block:n=x", "block:n=-1", "kv:k"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
	l, err := SplitList("f16, q8_0,kv:k=q4_0,v=q8_0,q4_0")
	if got, want := strings.Join(l, "|"), "f16|q8_0|kv:k=q4_0,v=q8_0|q4_0"; got != want || err != nil {
		t.Errorf("SplitList: %q %v, want %q", got, err, want)
	}
}

// TestKVListGrammar: a comma piece continues the settings of the item
// before it only when it is key=value up to its first '+', so a
// configuration of two items with settings is not cut at the comma inside
// the first; empty pieces and orphan settings are errors.
func TestKVListGrammar(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"streaming:sinks=4,window=2+snapkv:capacity=40", "streaming:sinks=4,window=2+snapkv:capacity=40"},
		{"f16,streaming:sinks=4,window=256,q8_0", "f16|streaming:sinks=4,window=256|q8_0"},
		{"q8_0+streaming:sinks=4,window=60,kivi4:g=16,r=16", "q8_0+streaming:sinks=4,window=60|kivi4:g=16,r=16"},
		{"kv:k=q4_0,v=f16+block:n=32,f16", "kv:k=q4_0,v=f16+block:n=32|f16"},
	} {
		l, err := SplitList(c.in)
		if got := strings.Join(l, "|"); got != c.want || err != nil {
			t.Errorf("SplitList(%q) = %q %v, want %q", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"f16,,q8_0", "empty configuration"},
		{"f16,", "empty configuration"},
		{"window=4", "starts with the setting"},
		{"f16,r=3", `follows "f16", which has no settings`},
	} {
		if _, err := SplitList(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SplitList(%q): %v, want %q", c.in, err, c.want)
		}
	}
	c, err := Parse("streaming:sinks=4,window=2+snapkv:capacity=40")
	if err == nil {
		t.Errorf("two policies in one configuration accepted: %+v", c)
	}
}

// TestParseConflicts: two items of one configuration that set the same
// thing are refused naming both (f16+f32 used to run as f32 under the name
// f16+f32), as are a configuration listed twice and a setting given twice;
// a bad KIVI setting is named as such.
func TestParseConflicts(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"f16+f32", "f32 sets the K and V formats, which f16 already set"},
		{"f16+f16", "f16 sets the K and V formats, which f16 already set"},
		{"q8_0+kv:v=f16", "kv:v=f16 sets the V format, which q8_0 already set"},
		{"quest:budget=64+streaming:sinks=4,window=60", "sets the KV policy, which quest:budget=64 already set"},
		{"block:n=32+block:n=16", "sets the block size"},
		{"streaming:sinks=4,sinks=8", "setting sinks given twice"},
		{"quest:", "a ':' with no settings"},
		{"f16:x=1", "the f16 format takes no settings"},
		{"kivi2:r=-1", `r="-1" must be a whole number in [0, 1048576] (recent tokens kept in f16)`},
		{"kivi2:g=0", `g="0" must be a whole number in [1, 1048576]`},
		{"kivi2:r=32,r=64", "option r given twice"},
	} {
		_, err := Parse(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q): %v, want %q", c.in, err, c.want)
		}
		if err != nil && strings.Contains(c.in, "kivi") && strings.Contains(err.Error(), "not a registered item") {
			t.Errorf("Parse(%q): %v buries the KIVI error", c.in, err)
		}
	}
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"f16,f16"}, `configuration "f16" given twice`},
		{[]string{"f16", "q8_0,F16"}, `configuration "F16" given twice (also as "f16")`},
		{[]string{"streaming:sinks=4,window=8,streaming:window=8,sinks=4"}, "given twice"},
	} {
		if _, err := ParseList(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseList(%q): %v, want %q", c.in, err, c.want)
		}
	}
	cfgs, err := ParseList([]string{"f16,kv:k=q8_0,v=f16+block:n=32", "streaming:sinks=4,window=2+q8_0"})
	if err != nil || len(cfgs) != 3 || cfgs[1].Setup.KFormat != kvcache.Q8_0 || cfgs[1].Setup.VFormat != kvcache.F16 ||
		cfgs[1].Setup.BlockSize != 32 || cfgs[2].Setup.Policy == nil || cfgs[2].Setup.KFormat != kvcache.Q8_0 || cfgs[2].Setup.Budget != 6 {
		t.Errorf("ParseList: %+v %v", cfgs, err)
	}
}

// TestSegmentOfOne: a one-token segment predicts nothing; Run refuses it
// rather than report a table of zeros.
func TestSegmentOfOne(t *testing.T) {
	m, ids := openStories(t)
	if _, err := Run(m, ids, mustParse(t, "f16"), Options{Segment: 1}); err == nil || !strings.Contains(err.Error(), "predict nothing") {
		t.Errorf("segment 1: %v", err)
	}
}

// lossyWindow is a sliding window the model does not have: a policy that
// drops positions on purpose.
type lossyWindow struct{ kvcache.WindowPolicy }

func (lossyWindow) Lossy() bool { return true }

// TestRegister: a policy registered by name is built by Parse with its
// options and reaches the cache: a window of 8 tokens loses quality
// against the full cache and holds fewer bytes.
func TestRegister(t *testing.T) {
	Register("test-window", "sliding window, for the test", func(s *Setup, p *Params) error {
		w, err := p.Int("window", 0)
		if err == nil && w <= 0 {
			err = fmt.Errorf("test-window: window=%d", w)
		}
		s.Policy = func() kvcache.Policy { return lossyWindow{kvcache.WindowPolicy{W: w}} }
		return err
	})
	if _, err := Parse("test-window:window=0"); err == nil {
		t.Error("window=0 accepted")
	}
	m, ids := openStories(t)
	rep, err := Run(m, ids, mustParse(t, "f32", "f16+test-window:window=8"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	full, win := byName(t, rep, "f32"), byName(t, rep, "f16+test-window:window=8")
	t.Logf("window 8: KL %.3g, top-1 %.3f, peak %d bytes (full f32 %d)", win.KLMean, win.Top1, win.PeakBytes, full.PeakBytes)
	if !(win.KLMean > 1e-3) || win.PeakBytes >= full.PeakBytes/2 {
		t.Errorf("window 8: KL %g, peak %d bytes (full f32 %d)", win.KLMean, win.PeakBytes, full.PeakBytes)
	}
}

// TestStoriesKIVI: on stories260K (a text of about 100 tokens, so a
// residual of 32), 4-bit KIVI loses less than 2-bit; with no residual
// window (r=0) every group is quantized and the loss is larger; and at 2 bits keys quantized per channel (KIVI) lose less than
// keys quantized per token, the claim KIVI rests on.
func TestStoriesKIVI(t *testing.T) {
	m, ids := openStories(t)
	rep, err := Run(m, ids, mustParse(t, "kivi4:r=32", "kivi2:r=32", "kivi2:r=0", "kivi2:r=0,k=token"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	k4, k2, k2r0, k2tok := byName(t, rep, "kivi4:r=32"), byName(t, rep, "kivi2:r=32"), byName(t, rep, "kivi2:r=0"), byName(t, rep, "kivi2:r=0,k=token")
	t.Logf("KL kivi4 %.3g kivi2 %.3g kivi2:r=0 %.3g kivi2:r=0,k=token %.3g", k4.KLMean, k2.KLMean, k2r0.KLMean, k2tok.KLMean)
	if !(0 < k4.KLMean && k4.KLMean < k2.KLMean && k2.KLMean < k2r0.KLMean && 2*k2r0.KLMean < k2tok.KLMean) {
		t.Errorf("KL kivi4 %g, kivi2 %g, kivi2:r=0 %g, per-token keys %g: want increasing, per-token keys over twice per-channel",
			k4.KLMean, k2.KLMean, k2r0.KLMean, k2tok.KLMean)
	}
	if !(k2r0.BytesPerToken < k2.BytesPerToken) {
		t.Errorf("bytes/token: r=0 %g, r=128 %g", k2r0.BytesPerToken, k2.BytesPerToken)
	}
}

func TestWriteSVG(t *testing.T) {
	var b strings.Builder
	rep := &Report{Results: []Result{{Name: "f16", KLMean: 1e-6, BytesPerToken: 640}, {Name: "kivi2 <2b>", KLMean: 0.05, BytesPerToken: 180}, {Name: "f32", BytesPerToken: 1280}}}
	if err := WriteSVG(&b, rep, "stories260K"); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.Count(s, "<circle") != 3 || !strings.Contains(s, "kivi2 &lt;2b&gt;") || !strings.HasSuffix(s, "</svg>\n") {
		t.Errorf("svg:\n%s", s)
	}
}
