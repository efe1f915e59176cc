package eval

import (
	"sort"
	"strings"

	"pagoda/kvcache"
)

// The KV policies of package kvcache, under the names and settings of
// kvcache.ParsePolicy (and --kv-policy): "streaming:sinks=4,window=60",
// "quest:budget=128", "h2o:heavy=0.1,recent=0.1", "snapkv:capacity=64".
// A plain recent window is streaming with sinks=0; kvcache's "window"
// policy is the model's own sliding window, which the model must know of,
// so it is not offered here.
func init() {
	for _, p := range []struct{ name, help string }{
		{"streaming", "StreamingLLM sinks + recent window: streaming:sinks=4,window=256[,pos=shift]"},
		{"quest", "Quest page selection: quest:budget=1024[,dense=2]"},
		{"h2o", "H2O heavy hitters + recent: h2o:heavy=0.1,recent=0.1"},
		{"snapkv", "SnapKV prompt compression: snapkv:capacity=1024[,window=32,kernel=7]"},
	} {
		name := p.name
		Register(name, p.help, func(s *Setup, ps *Params) error {
			spec := name
			if rest := ps.rest(); rest != "" {
				spec += ":" + rest
			}
			// Parse once now so a bad setting fails before any model runs;
			// each fresh cache then gets its own policy state.
			if _, err := kvcache.ParsePolicy(spec); err != nil {
				return err
			}
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
