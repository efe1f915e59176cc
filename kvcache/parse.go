package kvcache

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ParsePolicy builds a cache policy from a configuration string, the form
// the --kv-policy flag and evaluation tables use: a name, then a colon and
// comma-separated key=value settings, all optional:
//
//	full
//	window:w=4096
//	streaming:sinks=4,window=256              (positions within the cache)
//	streaming:sinks=4,window=256,pos=shift,ctx=2048  (llama.cpp context shift)
//	quest:budget=1024,dense=2
//	h2o:heavy=0.1,recent=0.1                  (fractions of the sequence, or counts ≥ 1)
//	snapkv:capacity=1024,window=32,kernel=7
//
// An unknown name or key, or a value out of range, is an error.
func ParsePolicy(s string) (Policy, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(s), ":")
	kv := map[string]string{}
	if rest != "" {
		for _, f := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("kvcache: policy %q: setting %q is not key=value", s, f)
			}
			kv[strings.ToLower(k)] = v
		}
	}
	a := &args{policy: s, kv: kv}
	var p Policy
	switch strings.ToLower(name) {
	case "", "full":
		p = FullPolicy{}
	case "window":
		p = WindowPolicy{W: a.int("w", 0)}
		if a.err == nil && p.(WindowPolicy).W < 1 {
			a.err = fmt.Errorf("kvcache: policy %q: window needs w >= 1", s)
		}
	case "streaming", "streamingllm", "sinks":
		sp := StreamingPolicy{Sinks: a.int("sinks", 4), Window: a.int("window", 256)}
		switch pos := a.str("pos", "cache"); pos {
		case "cache":
		case "shift":
			sp.Scheme = PosShift
			sp.Ctx = a.int("ctx", sp.Sinks+2*sp.Window)
		default:
			a.fail("pos must be cache or shift, not %q", pos)
		}
		if a.err == nil {
			a.err = sp.Check()
		}
		p = sp
	default:
		if mk, ok := policyMakers[strings.ToLower(name)]; ok {
			p = mk(a)
			break
		}
		return nil, fmt.Errorf("kvcache: unknown policy %q (want %s)", name, strings.Join(policyNames(), ", "))
	}
	if a.err != nil {
		return nil, a.err
	}
	if len(a.kv) > 0 {
		var keys []string
		for k := range a.kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return nil, fmt.Errorf("kvcache: policy %q: unknown setting %s", s, strings.Join(keys, ", "))
	}
	if ck, ok := p.(interface{ Check() error }); ok {
		if err := ck.Check(); err != nil {
			return nil, err
		}
	}
	return p, nil
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

// args reads a policy's settings, remembering the first error; every key
// read is consumed, so leftovers are unknown.
type args struct {
	policy string
	kv     map[string]string
	err    error
}

func (a *args) fail(format string, v ...any) {
	if a.err == nil {
		a.err = fmt.Errorf("kvcache: policy %q: %s", a.policy, fmt.Sprintf(format, v...))
	}
}

func (a *args) str(k, def string) string {
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	return v
}

func (a *args) int(k string, def int) int {
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		a.fail("%s=%q is not a non-negative integer", k, v)
	}
	return n
}

func (a *args) float(k string, def float64) float64 {
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	delete(a.kv, k)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f != f {
		a.fail("%s=%q is not a non-negative number", k, v)
	}
	return f
}
