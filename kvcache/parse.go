package kvcache

import (
	"cmp"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ParsePolicy builds a cache policy from a configuration string, the form
// the --kv-policy flag and evaluation tables use: a name, then a colon and
// comma-separated key=value settings, all optional:
//
//	full                                      (also none)
//	window:w=4096
//	streaming:sinks=4,window=256              (positions within the cache)
//	streaming:sinks=4,window=256,pos=shift,ctx=2048  (llama.cpp context shift)
//	quest:budget=1024,dense=2
//	h2o:heavy=0.1,recent=0.1                  (fractions of the sequence, or counts ≥ 1)
//	snapkv:capacity=1024,window=32,kernel=7
//
// An unknown name or key, or a value out of range, is an error.
func ParsePolicy(s string) (Policy, error) {
	name, kv, err := splitSettings(s, "policy")
	if err != nil {
		return nil, err
	}
	a := &args{policy: s, kv: kv}
	var p Policy
	switch name {
	case "", "full", "none":
		p = FullPolicy{}
	case "window":
		p = WindowPolicy{W: a.int("w", 0)}
		if a.err == nil && p.(WindowPolicy).W < 1 {
			a.err = fmt.Errorf("kvcache: policy %q: window needs w >= 1 (the model's own sliding window)", s)
		}
	case "streaming", "streamingllm", "sinks":
		p = parseStreaming(a)
	default:
		if mk, ok := policyMakers[name]; ok {
			p = mk(a)
			break
		}
		return nil, fmt.Errorf("kvcache: unknown policy %q (want %s)", name, strings.Join(policyNames(), ", "))
	}
	// An unknown setting is named before any range error: "window:size=8"
	// is a misspelt w, not a w of 0.
	if err := a.leftover(name); err != nil {
		return nil, err
	}
	if a.err != nil {
		return nil, a.err
	}
	if ck, ok := p.(interface{ Check() error }); ok {
		if err := ck.Check(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func parseStreaming(a *args) Policy {
	sp := StreamingPolicy{Sinks: a.int("sinks", 4), Window: a.int("window", 256)}
	switch pos := a.str("pos", "cache"); pos {
	case "cache":
		if _, ok := a.kv["ctx"]; ok {
			delete(a.kv, "ctx")
			a.fail("ctx is the cache of a context shift; it needs pos=shift")
		}
		a.known = append(a.known, "ctx")
	case "shift":
		sp.Scheme = PosShift
		sp.Ctx = a.int("ctx", sp.Sinks+2*sp.Window)
	default:
		a.fail("pos must be cache or shift, not %q", pos)
	}
	if a.err == nil {
		a.err = sp.Check()
	}
	return sp
}

// splitSettings splits "name:key=value,..." into the lowered name and its
// settings, refusing a ':' with nothing after it, a setting that is not
// key=value and a key given twice (which would otherwise silently win).
func splitSettings(s, what string) (string, map[string]string, error) {
	name, rest, colon := strings.Cut(strings.TrimSpace(s), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	kv := map[string]string{}
	if !colon {
		return name, kv, nil
	}
	if strings.TrimSpace(rest) == "" {
		return "", nil, fmt.Errorf("kvcache: %s %q: a ':' with no settings after it (write %s alone for its defaults)", what, s, name)
	}
	for _, f := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		k = strings.ToLower(strings.TrimSpace(k))
		if !ok || k == "" {
			return "", nil, fmt.Errorf("kvcache: %s %q: setting %q is not key=value", what, s, f)
		}
		if _, dup := kv[k]; dup {
			return "", nil, fmt.Errorf("kvcache: %s %q: setting %s given twice", what, s, k)
		}
		kv[k] = strings.TrimSpace(v)
	}
	return name, kv, nil
}

// CheckContext refuses a policy whose token counts exceed a context of
// ctx tokens: a budget, capacity or sink count no sequence can reach is a
// typo (an extra zero), not a setting to accept in silence. ctx <= 0
// checks nothing.
func CheckContext(p Policy, ctx int) error {
	if ctx <= 0 {
		return nil
	}
	over := func(what string, n int) error {
		if n <= ctx {
			return nil
		}
		return fmt.Errorf("kvcache: policy %v: %s is %d tokens, more than the context of %d (want at most %d)", p, what, n, ctx, ctx)
	}
	switch q := p.(type) {
	case *StreamingPolicy:
		return CheckContext(*q, ctx)
	case StreamingPolicy:
		if err := over("sinks + window", q.Sinks+q.Window); err != nil {
			return err
		}
		if q.Scheme == PosShift {
			return over("the shifted cache (ctx)", q.Ctx)
		}
	case *QuestPolicy:
		return over("the budget", q.Budget)
	case *SnapKVPolicy:
		return over("the capacity", q.Capacity)
	case *H2OPolicy:
		if q.Heavy >= 1 && q.Recent >= 1 {
			return over("heavy + recent", int(q.Heavy+q.Recent))
		}
		for _, c := range []struct {
			what string
			n    float64
		}{{"heavy", q.Heavy}, {"recent", q.Recent}} {
			if c.n >= 1 {
				if err := over(c.what, int(c.n)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// policyMakers are the policies defined in their own files.
var policyMakers = map[string]func(*args) Policy{}

func policyNames() []string {
	n := []string{"full", "window", "streaming"}
	for k := range policyMakers {
		n = append(n, k)
	}
	sort.Strings(n[3:])
	return n
}

// maxSetting bounds every count a policy reads (tokens, layers): far past
// any context, and small enough that no sum of settings overflows.
const maxSetting = 1 << 30

// args reads a policy's settings, remembering the first error; every key
// read is consumed, so leftovers are unknown.
type args struct {
	policy string
	kv     map[string]string
	known  []string // the keys read, for naming them when one is unknown
	err    error
}

// leftover is the error for settings no reader consumed, naming the
// policy's known settings.
func (a *args) leftover(name string) error {
	if len(a.kv) == 0 {
		return nil
	}
	var keys []string
	for k := range a.kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	known := "takes no settings"
	if len(a.known) > 0 {
		known = "takes " + strings.Join(a.known, ", ")
	}
	return fmt.Errorf("kvcache: policy %q: unknown setting %s (%s %s)", a.policy, strings.Join(keys, ", "), cmp.Or(name, "full"), known)
}

func (a *args) fail(format string, v ...any) {
	if a.err == nil {
		a.err = fmt.Errorf("kvcache: policy %q: %s", a.policy, fmt.Sprintf(format, v...))
	}
}

func (a *args) str(k, def string) string {
	a.known = append(a.known, k)
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	return v
}

func (a *args) int(k string, def int) int {
	a.known = append(a.known, k)
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxSetting {
		a.fail("%s=%q is not an integer in [0, %d]", k, v, maxSetting)
	}
	return n
}

func (a *args) float(k string, def float64) float64 {
	a.known = append(a.known, k)
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= maxSetting) {
		a.fail("%s=%q is not a number in [0, %d]", k, v, maxSetting)
	}
	return f
}

// Configure applies a KV configuration string to cfg, whose shape fields
// (NLayer, NKVHead, HeadDim, DType) must be set: a policy (ParsePolicy)
// becomes cfg.Policy; "minicache:from=L,t=0.5,retain=0.5,spare=4" lays
// out cfg.Groups with adjacent layers merged from layer L on (default:
// the middle layer). This is the one entry point an evaluation needs.
func Configure(cfg *Config, spec string) error {
	name, _, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if strings.ToLower(strings.TrimSpace(name)) != "minicache" {
		p, err := ParsePolicy(spec)
		if err != nil {
			return err
		}
		cfg.Policy = p
		return nil
	}
	if cfg.NLayer < 2 || cfg.NKVHead <= 0 || cfg.HeadDim <= 0 || len(cfg.Groups) > 0 {
		return fmt.Errorf("kvcache: %q needs a plain shape of at least 2 layers (got %d layers, %d groups)", spec, cfg.NLayer, len(cfg.Groups))
	}
	_, kv, err := splitSettings(spec, "layout")
	if err != nil {
		return err
	}
	a := &args{policy: spec, kv: kv}
	from := a.int("from", cfg.NLayer/2)
	t, retain, spare := a.float("t", 0.5), a.float("retain", 0.5), a.int("spare", cmp.Or(cfg.BlockSize, DefaultBlockSize)/4)
	if err := a.leftover("minicache"); err != nil {
		return err
	}
	if a.err != nil {
		return a.err
	}
	if from >= cfg.NLayer-1 || t > 1 {
		return fmt.Errorf("kvcache: %q: from must leave a pair below %d layers, t must be in [0, 1]", spec, cfg.NLayer)
	}
	var base Format = cfg.DType
	if cfg.KFormat != nil || cfg.VFormat != nil {
		return fmt.Errorf("kvcache: %q keeps its directions in the cache's dtype; separate K/V formats are not supported with it", spec)
	}
	cfg.Groups = MiniCacheGroups(cfg.NLayer, cfg.NKVHead, cfg.HeadDim, from, base, t, retain, spare)
	return nil
}
