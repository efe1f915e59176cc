package kvcache

// BlockHash chains the hash of a full block to its parent's: the hash of
// block i covers every token before it, so equal hashes mean equal
// prefixes (up to collisions, which lookups rule out by comparing token
// ids). extra separates caches that must not share blocks even for equal
// tokens (model, LoRA adapter, multimodal input).
func BlockHash(parent uint64, tokens []int32, extra uint64) uint64 {
	const prime = 0x100000001b3
	h := uint64(0xcbf29ce484222325)
	h = (h ^ mix(parent)) * prime
	h = (h ^ mix(extra)) * prime
	for _, t := range tokens {
		h = (h ^ uint64(uint32(t))) * prime
	}
	return mix(h)
}

// mix is the splitmix64 finaliser: FNV alone spreads small integers poorly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// SaltKey folds a per-request cache salt (vLLM's cache_salt) into the
// extra key of the hash chain, so requests with different salts never
// share a block even for equal prompts, while an empty salt leaves extra
// unchanged and shares with every other unsalted request. Keying every
// block rather than only the first changes nothing: the chain already
// makes each block's hash depend on the first's.
func SaltKey(extra uint64, salt string) uint64 {
	if salt == "" {
		return extra
	}
	const prime = 0x100000001b3
	h := uint64(0xcbf29ce484222325)
	h = (h ^ mix(extra)) * prime
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * prime
	}
	// The length keeps "ab"+"" apart from "a"+"b" should salts ever be
	// combined; the constant keeps a salted key off the unsalted one.
	h = (h ^ uint64(len(salt))) * prime
	return mix(h ^ 0x5a17)
}

// namespace is the hash namespace of the blocks a policy configured as
// key computes over less than the full history. It is a fixed function of
// the key, not of a per-process seed, so replicas and restarts agree on
// block hashes (a prefix-aware router compares them across processes).
// Odd, so it is never 0, which means "no namespace".
func namespace(key string) uint64 {
	const prime = 0x100000001b3
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	// The constant keeps a namespace off SaltKey's values for a salt that
	// happens to spell the key.
	return mix(h^0x9a7e5) | 1
}
