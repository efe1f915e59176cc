package main

import (
	"flag"
	"fmt"

	"pagoda/generate"
	"pagoda/kvcache"
	"pagoda/model"
)

// kvFlags are --kv-dtype, --kv-dtype-k and --kv-dtype-v of the
// single-sequence commands (run, score, bench): unset, they keep the
// model's flat f32 cache; set, a paged cache of that format.
type kvFlags struct{ all, k, v *string }

func addKVFlags(fs *flag.FlagSet) *kvFlags {
	return &kvFlags{
		all: fs.String("kv-dtype", "", "KV-cache storage (default: the exact flat f32 cache): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, kivi2, kivi4[:g=32,r=128]"),
		k:   fs.String("kv-dtype-k", "", "KV-cache storage of keys (default --kv-dtype)"),
		v:   fs.String("kv-dtype-v", "", "KV-cache storage of values (default --kv-dtype)"),
	}
}

// newCache is the cache maker the flags ask for, nil when none was set,
// or an error naming the flag when the format does not suit m.
func (f *kvFlags) newCache(m *model.Model) (generate.NewCache, error) {
	if *f.all == "" && *f.k == "" && *f.v == "" {
		return nil, nil
	}
	def := *f.all
	if def == "" {
		def = "f16"
	}
	k, err := parseKVFormat(*f.k, def)
	if err != nil {
		return nil, err
	}
	v, err := parseKVFormat(*f.v, def)
	if err != nil {
		return nil, err
	}
	c := &m.Config
	shape := kvcache.Shape{NLayer: c.NLayer, NHead: c.NHead, NKVHead: c.NKVHead, HeadDim: c.HeadDim}
	if sz := kvcache.SizeOf(shape, k, v, 0); sz.Err != nil {
		return nil, fmt.Errorf("--kv-dtype K %v V %v: %w", k, v, sz.Err)
	}
	return func(maxLen int) (model.KVCache, error) { return kvcache.NewSingle(c, k, v, maxLen) }, nil
}
