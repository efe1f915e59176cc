// Package eval measures what a KV-cache technique costs and buys: it runs
// a token stream teacher-forced through a model once on the exact cache
// (f32, every position attended) and once per configuration under test,
// in lockstep, and compares the next-token distributions: KL divergence,
// top-1 agreement, perplexity, KV bytes per token and speed.
//
// An in-distribution evaluation text for stories260K is the model's own
// seeded samples at temperature 1 (about 7,800 tokens):
//
//	for s in $(seq 1 16); do pagoda run --threads 1 -p "Once upon a time" -n 480 \
//	    --temp 1 --seed $s --ignore-eos >> corpus.txt; echo >> corpus.txt; done
//	pagoda eval --threads 1 -f corpus.txt --kv f16,bf16,kivi4,kivi2,kivi2:k=token
//
// docs/eval (scripts/eval-policies.sh) measures the KV policies on it:
// StreamingLLM over streams longer than the cache, Quest, H2O and SnapKV
// at equal budgets after a prompt pass (Options.Prefill), MiniCache and
// key channels against the memory they save.
package eval

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"pagoda/kvcache"
	"pagoda/model"
)

// Setup is what one KV configuration sets on the cache it is evaluated on.
// A Builder fills it in; fields left zero keep the exact cache's choice.
type Setup struct {
	KFormat, VFormat kvcache.Format // nil: f32
	// Policy makes the policy of one fresh cache (a segment's), so state
	// kept per sequence never leaks between segments; nil: every
	// position attended.
	Policy    func() kvcache.Policy
	BlockSize int // 0: the format's group or kvcache.DefaultBlockSize
	// Layout, when set, changes the cache's configuration (built with the
	// fields above) before each fresh cache is made: MiniCache's merged
	// layer pairs, per-layer key channels. It is given the model.
	Layout func(m *model.Model, cfg *kvcache.Config) error
	// Budget is, for plots, the tokens a query attends at most (a policy's
	// budget); 0: not a budgeted policy.
	Budget int
	// Series labels the configuration's plot line (default its name):
	// configurations differing only in their budget share one.
	Series string
}

// Params are an item's key=value options ("sinks=4,window=256"). A
// Builder reads them with Int or String; Parse fails on any it left
// unread, so a misspelt key is an error, not a silent default.
type Params struct {
	item string
	kv   map[string]string
	used map[string]bool
}

// Int reads key as an integer, def when absent.
func (p *Params) Int(key string, def int) (int, error) {
	s, ok := p.kv[key]
	if !ok {
		return def, nil
	}
	p.used[key] = true
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("eval: %s: %s=%q is not an integer", p.item, key, s)
	}
	return v, nil
}

// String reads key, def when absent.
func (p *Params) String(key, def string) string {
	s, ok := p.kv[key]
	if !ok {
		return def
	}
	p.used[key] = true
	return s
}

// Builder applies one configuration item to s.
type Builder func(s *Setup, p *Params) error

type entry struct {
	help  string
	build Builder
}

var (
	regMu    sync.Mutex
	registry = map[string]entry{}
)

// Register makes name usable as a configuration item:
// "name" or "name:key=value,...", alone or joined to others with '+'
// ("q8_0+streaming:sinks=4,window=256"). A KV policy registers itself
// with one call from an init function:
//
//	eval.Register("streaming", "StreamingLLM sinks + window", func(s *eval.Setup, p *eval.Params) error {
//		sinks, err := p.Int("sinks", 4)
//		...
//		s.Policy = func() kvcache.Policy { return kvcache.NewStreamingPolicy(sinks, window) }
//		return nil
//	})
//
// Names that are not registered are read as KV storage formats
// (kvcache.ParseFormat) for both K and V. Register panics on a duplicate.
func Register(name, help string, b Builder) {
	regMu.Lock()
	defer regMu.Unlock()
	name = strings.ToLower(name)
	if _, dup := registry[name]; dup {
		panic("eval: " + name + " registered twice")
	}
	registry[name] = entry{help, b}
}

// Registered lists the registered item names with their help.
func Registered() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var out []string
	for n, e := range registry {
		out = append(out, n+": "+e.help)
	}
	sort.Strings(out)
	return out
}

func init() {
	Register("kv", "different K and V formats: kv:k=q4_0,v=q8_0", func(s *Setup, p *Params) error {
		for _, kv := range []struct {
			key string
			f   *kvcache.Format
		}{{"k", &s.KFormat}, {"v", &s.VFormat}} {
			name := p.String(kv.key, "")
			if name == "" {
				continue
			}
			f, err := kvcache.ParseFormat(name)
			if err != nil {
				return err
			}
			*kv.f = f
		}
		return nil
	})
	Register("block", "block size in tokens: block:n=32", func(s *Setup, p *Params) error {
		n, err := p.Int("n", 0)
		if err == nil && n <= 0 {
			err = fmt.Errorf("eval: block: n=%d must be positive", n)
		}
		s.BlockSize = n
		return err
	})
}

// Config is one parsed configuration.
type Config struct {
	Name  string // as written
	Setup Setup
}

// Parse reads one configuration: items joined by '+', each an item name
// with optional ":key=value,..." options.
func Parse(s string) (Config, error) {
	c := Config{Name: s}
	if strings.TrimSpace(s) == "" {
		return c, fmt.Errorf("eval: empty KV configuration")
	}
	for _, item := range strings.Split(s, "+") {
		name, opts, _ := strings.Cut(item, ":")
		name = strings.ToLower(strings.TrimSpace(name))
		regMu.Lock()
		e, ok := registry[name]
		regMu.Unlock()
		if !ok {
			f, err := kvcache.ParseFormat(item)
			if err != nil {
				return c, fmt.Errorf("eval: %q: not a registered item (%s) nor a KV format: %w", item, strings.Join(names(), ", "), err)
			}
			c.Setup.KFormat, c.Setup.VFormat = f, f
			continue
		}
		p := &Params{item: item, kv: map[string]string{}, used: map[string]bool{}}
		if opts != "" {
			for _, kv := range strings.Split(opts, ",") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return c, fmt.Errorf("eval: %q: option %q is not key=value", item, kv)
				}
				p.kv[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if err := e.build(&c.Setup, p); err != nil {
			return c, err
		}
		for k := range p.kv {
			if !p.used[k] {
				return c, fmt.Errorf("eval: %q: unknown option %q", item, k)
			}
		}
	}
	return c, nil
}

func names() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var out []string
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// SplitList splits a comma list of configurations. A piece that is a bare
// key=value (no ':' or '+') continues the options of the piece before it,
// so "f16,streaming:sinks=4,window=256" is two configurations.
func SplitList(s string) []string {
	var out []string
	for _, piece := range strings.Split(s, ",") {
		piece = strings.TrimSpace(piece)
		if piece == "" {
			continue
		}
		if len(out) > 0 && strings.Contains(piece, "=") && !strings.ContainsAny(piece, ":+") && strings.Contains(out[len(out)-1], ":") {
			out[len(out)-1] += "," + piece
			continue
		}
		out = append(out, piece)
	}
	return out
}
