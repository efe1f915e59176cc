package eval

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"

	"pagoda/executor"
	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/sample"
	"pagoda/tokenizer"
)

// The KV policies of package kvcache, under the names and settings of
// kvcache.ParsePolicy (and --kv-policy): "streaming:sinks=4,window=60",
// "quest:budget=128", "h2o:heavy=0.1,recent=0.1", "snapkv:capacity=64".
// A plain recent window is streaming with sinks=0; kvcache's "window"
// policy is the model's own sliding window, which the model must know of,
// so it is not offered here.
//
// Each sets Setup.Budget to the tokens a query attends at most (sinks +
// window, Quest's budget, H2O's heavy + recent when both are counts,
// SnapKV's capacity for the prompt) and Setup.Series to the item without
// its budget settings, so a plot draws one line per policy.
func init() {
	for _, p := range []struct {
		name, help string
		budgetKeys []string // settings that only size the budget
	}{
		{"streaming", "StreamingLLM sinks + recent window: streaming:sinks=4,window=256[,pos=shift]", []string{"window"}},
		{"quest", "Quest page selection: quest:budget=1024[,dense=2]", []string{"budget"}},
		{"h2o", "H2O heavy hitters + recent: h2o:heavy=0.1,recent=0.1", []string{"heavy", "recent"}},
		{"snapkv", "SnapKV prompt compression (needs a prompt: --prefill): snapkv:capacity=1024[,window=32,kernel=7]", []string{"capacity"}},
	} {
		name, budgetKeys := p.name, p.budgetKeys
		Register(name, p.help, func(s *Setup, ps *Params) error {
			spec := name
			if rest := ps.rest(); rest != "" {
				spec += ":" + rest
			}
			// Parse once now so a bad setting fails before any model runs;
			// each fresh cache then gets its own policy state.
			pol, err := kvcache.ParsePolicy(spec)
			if err != nil {
				return err
			}
			s.Budget = policyBudget(pol)
			s.Series = ps.without(name, budgetKeys)
			s.Policy = func() kvcache.Policy {
				pol, err := kvcache.ParsePolicy(spec)
				if err != nil {
					panic(err) // parsed above
				}
				return pol
			}
			return nil
		})
	}
	Register("minicache", "MiniCache: adjacent layers merged from layer from on: minicache:from=2[,t=0.5,retain=0.5,spare=4]", func(s *Setup, ps *Params) error {
		spec := "minicache"
		if rest := ps.rest(); rest != "" {
			spec += ":" + rest
		}
		// A trial shape checks the settings now (the layer bound is
		// checked against the model when the cache is laid out).
		if err := kvcache.Configure(&kvcache.Config{NLayer: 1 << 10, NKVHead: 1, HeadDim: 8, DType: kvcache.F32}, spec); err != nil {
			return err
		}
		s.Series = ps.without("minicache", []string{"from"})
		s.Layout = func(_ *model.Model, cfg *kvcache.Config) error {
			if len(cfg.Groups) > 0 || cfg.KFormat != kvcache.F32 || cfg.VFormat != kvcache.F32 {
				return fmt.Errorf("eval: %s keeps f32 directions and takes no policy or other K/V format", spec)
			}
			cfg.KFormat, cfg.VFormat = nil, nil
			return kvcache.Configure(cfg, spec)
		}
		return nil
	})
	Register("channels", "key-channel reduction (ThinK): r channels of each key head kept, chosen by ‖Q_i‖·‖K_i‖ on the model's own sampled text: channels:r=4[,calib=512,seed=100]", func(s *Setup, ps *Params) error {
		r, err := ps.Int("r", 0)
		if err != nil {
			return err
		}
		n, err := ps.Int("calib", 512)
		if err != nil {
			return err
		}
		seed, err := ps.Int("seed", 100)
		if err != nil {
			return err
		}
		if r <= 0 || n < 2 {
			return fmt.Errorf("eval: channels: want r >= 1 and calib >= 2, got r=%d, calib=%d", r, n)
		}
		s.Series = "channels"
		var once struct {
			sync.Mutex
			m    *model.Model
			keep [][][]int
		}
		s.Layout = func(m *model.Model, cfg *kvcache.Config) error {
			c := &m.Config
			if r > c.HeadDim {
				return fmt.Errorf("eval: channels: r=%d above the head width %d", r, c.HeadDim)
			}
			if len(cfg.Groups) > 0 {
				return fmt.Errorf("eval: channels takes no policy or layer layout besides")
			}
			once.Lock()
			defer once.Unlock()
			if once.m != m {
				stats, err := calibrateChannels(m, n, uint64(seed))
				if err != nil {
					return fmt.Errorf("eval: channels: calibration: %w", err)
				}
				once.m, once.keep = m, stats.Keep(r)
			}
			for l := 0; l < c.NLayer; l++ {
				cfg.Groups = append(cfg.Groups, kvcache.GroupSpec{Layers: []int{l}, NKVHead: c.NKVHead, KDim: c.HeadDim, VDim: c.HeadDim,
					KFormat: &kvcache.ChannelFormat{Base: cfg.KFormat, Keep: once.keep[l]}, VFormat: cfg.VFormat})
			}
			return nil
		}
		return nil
	})
}

// policyBudget is the tokens a query under pol attends at most, 0 when
// that is not a fixed count.
func policyBudget(pol kvcache.Policy) int {
	switch p := pol.(type) {
	case kvcache.StreamingPolicy:
		return p.Sinks + p.Window
	case *kvcache.StreamingPolicy:
		return p.Sinks + p.Window
	case *kvcache.QuestPolicy:
		return p.Budget
	case *kvcache.H2OPolicy:
		if p.Heavy >= 1 && p.Recent >= 1 {
			return int(p.Heavy + p.Recent)
		}
	case *kvcache.SnapKVPolicy:
		return p.Capacity
	}
	return 0
}

// calibrateChannels samples n tokens from m at temperature 1 (seeded),
// then runs them as one prompt through a cache that accumulates ThinK's
// channel statistics.
func calibrateChannels(m *model.Model, n int, seed uint64) (*kvcache.ChannelStats, error) {
	c := &m.Config
	n = min(n, c.ContextLen)
	toks := m.Tokenizer().Encode("", tokenizer.Options{AddSpecial: true})
	if len(toks) == 0 {
		toks = []int32{1}
	}
	flat := executor.NewLocal(m, model.NewFlatCache(c, 1, n))
	rng := rand.New(rand.NewPCG(seed, 77))
	lsm := make([]float32, c.VocabSize)
	for p := 0; len(toks) < n; { // p: tokens in the cache
		b := &executor.StepInput{Tokens: toks[p:], Logits: make([]bool, len(toks)-p)}
		for i := p; i < len(toks); i++ {
			b.Pos, b.Seq = append(b.Pos, int32(i)), append(b.Seq, 0)
		}
		b.Logits[len(b.Logits)-1] = true
		out, err := flat.Execute(b)
		if err != nil {
			return nil, err
		}
		lg := out.Logits
		p = len(toks)
		sample.LogSoftmax(lg[len(lg)-c.VocabSize:], lsm)
		u, next := rng.Float64(), int32(c.VocabSize-1)
		for i, v := range lsm {
			if u -= math.Exp(float64(v)); u <= 0 {
				next = int32(i)
				break
			}
		}
		toks = append(toks, next)
	}
	stats := kvcache.NewChannelStats(c.NLayer, c.NKVHead, c.HeadDim)
	cache, err := kvcache.New(kvcache.Config{NLayer: c.NLayer, NKVHead: c.NKVHead, HeadDim: c.HeadDim, BlockSize: 16,
		NumBlocks: n/16 + 2, DType: kvcache.F32, Policy: stats,
		Rope: &kvcache.Rotary{Freqs: c.Freqs(), Neox: c.RopeNeox, HeadDim: c.HeadDim}})
	if err != nil {
		return nil, err
	}
	defer cache.Close()
	if !cache.Allocate(0, nil, 0, n) {
		return nil, fmt.Errorf("no room for %d tokens", n)
	}
	b := &executor.StepInput{Tokens: toks, Logits: make([]bool, n)}
	b.Logits[n-1] = true
	for i := range toks {
		b.Pos, b.Seq = append(b.Pos, int32(i)), append(b.Seq, 0)
	}
	if _, err := executor.NewLocal(m, cache).Execute(b); err != nil {
		return nil, err
	}
	if err := stats.Keys(cache, 0, n); err != nil {
		return nil, err
	}
	return stats, nil
}

// rest hands every option to a parser that checks them itself, in a
// stable order.
func (p *Params) rest() string {
	var kv []string
	for k, v := range p.kv {
		p.used[k] = true
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// without is the item name with its options other than drop, for a
// series label.
func (p *Params) without(name string, drop []string) string {
	var kv []string
	for k, v := range p.kv {
		if !sliceHas(drop, k) {
			kv = append(kv, k+"="+v)
		}
	}
	if len(kv) == 0 {
		return name
	}
	sort.Strings(kv)
	return name + ":" + strings.Join(kv, ",")
}

func sliceHas(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
