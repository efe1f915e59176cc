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
// with optional ":key=value,..." settings (see SplitList for the grammar).
// Two items of one configuration may not set the same thing (two formats,
// two policies, two block sizes): which one applied would be a guess.
func Parse(s string) (Config, error) {
	c := Config{Name: s}
	if strings.TrimSpace(s) == "" {
		return c, fmt.Errorf("eval: empty KV configuration")
	}
	setBy := map[string]string{} // what an item set -> the item
	for _, item := range strings.Split(s, "+") {
		item = strings.TrimSpace(item)
		var one Setup
		if err := parseItem(&one, item); err != nil {
			return c, err
		}
		var clash []string
		prev := ""
		for _, f := range setupFields(one) {
			if p, dup := setBy[f]; dup {
				clash, prev = append(clash, f), p
			}
			setBy[f] = item
		}
		if len(clash) > 0 {
			what := strings.Join(clash, " and ")
			if what == "K format and V format" {
				what = "K and V formats"
			}
			return c, fmt.Errorf("eval: %q: %s sets the %s, which %s already set; one configuration takes one of each (to compare them, list them apart: %s,%s)", s, item, what, prev, prev, item)
		}
		merge(&c.Setup, one)
	}
	return c, nil
}

// parseItem applies one item to s, a fresh Setup.
func parseItem(s *Setup, item string) error {
	if item == "" {
		return fmt.Errorf("eval: empty item (a '+' with nothing on one side)")
	}
	name, opts, hasOpts := strings.Cut(item, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	regMu.Lock()
	e, ok := registry[name]
	regMu.Unlock()
	if !ok {
		return parseFormatItem(s, item, name, hasOpts)
	}
	p := &Params{item: item, kv: map[string]string{}, used: map[string]bool{}}
	if hasOpts {
		if strings.TrimSpace(opts) == "" {
			return fmt.Errorf("eval: %q: a ':' with no settings after it", item)
		}
		for _, kv := range strings.Split(opts, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k = strings.ToLower(strings.TrimSpace(k))
			if !ok || k == "" {
				return fmt.Errorf("eval: %q: setting %q is not key=value", item, kv)
			}
			if _, dup := p.kv[k]; dup {
				return fmt.Errorf("eval: %q: setting %s given twice", item, k)
			}
			p.kv[k] = strings.TrimSpace(v)
		}
	}
	if err := e.build(s, p); err != nil {
		return err
	}
	for k := range p.kv {
		if !p.used[k] {
			return fmt.Errorf("eval: %q: unknown setting %q", item, k)
		}
	}
	return nil
}

// parseFormatItem reads an item that is not registered as a KV format for
// both K and V. A known format's own error (a bad KIVI setting) is given
// as it is, not buried under the list of registered items.
func parseFormatItem(s *Setup, item, name string, hasOpts bool) error {
	f, err := kvcache.ParseFormat(item)
	if err == nil {
		s.KFormat, s.VFormat = f, f
		return nil
	}
	if bare, berr := kvcache.ParseFormat(name); berr == nil || strings.HasPrefix(name, "kivi") {
		if hasOpts && berr == nil && !strings.HasPrefix(name, "kivi") {
			return fmt.Errorf("eval: %q: the %s format takes no settings", item, bare)
		}
		return fmt.Errorf("eval: %q: %w", item, err)
	}
	return fmt.Errorf("eval: %q: not a registered item (%s) nor a KV format: %w", item, strings.Join(names(), ", "), err)
}

// setupFields names what s sets, for refusing two items that set the same.
func setupFields(s Setup) []string {
	var f []string
	if s.KFormat != nil {
		f = append(f, "K format")
	}
	if s.VFormat != nil {
		f = append(f, "V format")
	}
	if s.Policy != nil {
		f = append(f, "KV policy")
	}
	if s.BlockSize != 0 {
		f = append(f, "block size")
	}
	if s.Layout != nil {
		f = append(f, "cache layout")
	}
	return f
}

// merge copies what one item set into s.
func merge(s *Setup, one Setup) {
	if one.KFormat != nil {
		s.KFormat = one.KFormat
	}
	if one.VFormat != nil {
		s.VFormat = one.VFormat
	}
	if one.Policy != nil {
		s.Policy = one.Policy
	}
	if one.BlockSize != 0 {
		s.BlockSize = one.BlockSize
	}
	if one.Layout != nil {
		s.Layout = one.Layout
	}
	if one.Budget != 0 {
		s.Budget = one.Budget
	}
	if one.Series != "" {
		s.Series = one.Series
	}
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

// SplitList splits a --kv list into its configurations. The grammar:
//
//	list    = config { "," config }
//	config  = item { "+" item }
//	item    = name [ ":" setting { "," setting } ]
//	setting = key "=" value
//
// A comma separates both configurations and an item's settings, so a
// comma piece whose text before its first '+' is key=value (an '=' and no
// ':') continues the settings of the item before it; any other piece
// starts a new configuration. "f16,streaming:sinks=4,window=256" is two
// configurations; "streaming:sinks=4,window=60+kivi4:r=32" is one of two
// items (and "streaming:sinks=4,window=2+snapkv:capacity=40" one that
// Parse refuses: two policies). Spaces around pieces are ignored. An empty piece, or a
// setting after an item that has none, is an error.
func SplitList(s string) ([]string, error) {
	var out []string
	for _, piece := range strings.Split(s, ",") {
		piece = strings.TrimSpace(piece)
		if piece == "" {
			return nil, fmt.Errorf("eval: KV list %q has an empty configuration (two commas in a row, or one at an end)", s)
		}
		head, _, _ := strings.Cut(piece, "+")
		if !strings.Contains(head, "=") || strings.Contains(head, ":") {
			out = append(out, piece)
			continue
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("eval: KV list %q starts with the setting %q, which belongs after an item's name and ':'", s, head)
		}
		last := out[len(out)-1]
		if i := strings.LastIndex(last, "+"); !strings.Contains(last[i+1:], ":") {
			return nil, fmt.Errorf("eval: KV list %q: setting %q follows %q, which has no settings (write name:%s)", s, head, last[i+1:], head)
		}
		out[len(out)-1] += "," + piece
	}
	return out, nil
}

// ParseList parses the configurations of every --kv list in lists (an
// error names the list), refusing one given twice (the same items and settings, in any order of
// settings), which would only repeat a row.
func ParseList(lists []string) ([]Config, error) {
	var cfgs []Config
	seen := map[string]string{}
	for _, l := range lists {
		items, err := SplitList(l)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			c, err := Parse(it)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", l, err)
			}
			key := canonical(it)
			if prev, dup := seen[key]; dup {
				if prev == it {
					return nil, fmt.Errorf("%s: eval: configuration %q given twice", l, it)
				}
				return nil, fmt.Errorf("%s: eval: configuration %q given twice (also as %q)", l, it, prev)
			}
			seen[key] = it
			cfgs = append(cfgs, c)
		}
	}
	return cfgs, nil
}

// canonical is a configuration with names lowered and each item's
// settings sorted, so spellings of one configuration compare equal.
func canonical(s string) string {
	items := strings.Split(s, "+")
	for i, it := range items {
		name, opts, _ := strings.Cut(strings.TrimSpace(it), ":")
		sets := strings.Split(opts, ",")
		for j := range sets {
			sets[j] = strings.ToLower(strings.ReplaceAll(sets[j], " ", ""))
		}
		sort.Strings(sets)
		items[i] = strings.ToLower(strings.TrimSpace(name)) + ":" + strings.Join(sets, ",")
	}
	return strings.Join(items, "+")
}
