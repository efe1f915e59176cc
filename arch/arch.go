// Package arch declares each model architecture once: the names it goes by
// in GGUF and Hugging Face files, the tensors it stores (names, shapes,
// which are optional) and the parts its layer block is composed of. The
// loaders, synth, convert and quantize all read the same declaration, so
// adding an architecture is one file here (plus, for a new kind of part,
// its forward pass in package model).
package arch

import (
	"fmt"
	"sort"
	"strings"
)

// Dims are the hyper-parameters tensor shapes and presence depend on.
type Dims struct {
	Embd, Heads, KVHeads, HeadDim, FFN, Vocab int
	// Bias: the checkpoint has q/k/v biases where the architecture leaves
	// it to the checkpoint (llama's attention_bias).
	Bias bool
	// Tied: the token embedding doubles as the output matrix.
	Tied bool

	// Mixture of experts: Experts routed experts of width ExpertFFN (0:
	// a dense model), shared experts of total width SharedFFN (0: none),
	// and DenseLead leading layers with the dense FFN instead (deepseek2).
	Experts, ExpertFFN, SharedFFN, DenseLead int
	// Multi-head latent attention (deepseek2): QLoRA is the low-rank
	// query width (0: a plain attn_q), KVLoRA the latent width, QKNope and
	// QKRope a query/key head's unrotated and rotated parts, VHead the
	// value head width.
	QLoRA, KVLoRA, QKNope, QKRope, VHead int
	// KVBCombined: the checkpoint stores MLA's per-head up-projections as
	// one attn_kv_b (older conversions) rather than attn_k_b and attn_v_b.
	KVBCombined bool
	// Encoders (bert): learned absolute positions and token types.
	Positions, TokenTypes int
}

// Role is what a tensor is for, whatever it is named: the binder puts it in
// a field by role, synth fills it by role, quantize picks its type by role.
type Role uint8

// The roles of the tensors declared so far.
const (
	TokenEmbd Role = iota + 1
	OutputNorm
	Output
	AttnNorm
	AttnQ
	AttnK
	AttnV
	AttnOut
	AttnQBias
	AttnKBias
	AttnVBias
	AttnQNorm
	AttnKNorm
	FFNNorm
	FFNGate
	FFNUp
	FFNDown
	// Mixture of experts.
	FFNRouter     // ffn_gate_inp: expert logits
	FFNProbsBias  // exp_probs_b: selection bias (DeepSeek-V3 style)
	FFNGateExps   // 3-D: every expert's gate
	FFNUpExps     // 3-D
	FFNDownExps   // 3-D
	FFNSharedGate // ffn_gate_inp_shexp: the shared expert's sigmoid gate (qwen2moe)
	FFNGateShexp
	FFNUpShexp
	FFNDownShexp
	// Multi-head latent attention.
	AttnQA     // x → low-rank query
	AttnQANorm // RMSNorm of the low-rank query
	AttnQB     // low-rank query → heads
	AttnKVA    // x → [latent | rope key]
	AttnKVANorm
	AttnKVB // latent → [k_nope | v] per head (older files)
	AttnKB  // 3-D: per head, latent ← k_nope (absorbed into the query)
	AttnVB  // 3-D: per head, latent → v
)

// IsNorm says whether the role is an RMSNorm weight (which synth fills with
// ones, not noise).
func (r Role) IsNorm() bool {
	switch r {
	case OutputNorm, AttnNorm, AttnQNorm, AttnKNorm, FFNNorm, AttnQANorm, AttnKVANorm:
		return true
	}
	return false
}

// Tensor declares one stored tensor.
type Tensor struct {
	// Name is the GGUF name; a block tensor's without "blk.N.".
	Name string
	// HF is the Hugging Face name; a block tensor's without
	// "model.layers.N.".
	HF   string
	Role Role
	// Shape gives the ggml dims, row length first: [n] for a vector,
	// [cols, rows] for a matrix, [cols, rows, n] for a stack of n matrices
	// (MoE experts).
	Shape func(d Dims) []int
	// When says whether the architecture has the tensor under these
	// hyper-parameters; nil means always.
	When func(d Dims) bool
	// Optional tensors are used when the checkpoint has them and skipped
	// when it does not.
	Optional bool
	// Split is how the tensor divides across tensor-parallel ranks.
	Split Split
}

// In says whether the tensor belongs to a model with these dims.
func (t *Tensor) In(d Dims) bool { return t.When == nil || t.When(d) }

// Part is one piece of a layer block (an attention or a feed-forward
// kind); it declares the tensors it reads, in the order converters write
// them.
type Part interface {
	Tensors() []Tensor
}

// Arch is one architecture's declaration.
type Arch struct {
	// Name is the GGUF general.architecture the loaders use; Aliases are
	// other GGUF names that load as this one (mistral as llama).
	Name    string
	Aliases []string
	// HFTypes are the config.json model_type values of this architecture.
	HFTypes []string
	// Attn and FFN compose the block: x += Attn(norm(x)); x += FFN(norm(x)).
	// MoE, when set, replaces FFN in a checkpoint with experts (Dims.Experts
	// > 0) from layer Dims.DenseLead on; FFN may be nil for architectures
	// that are always MoE.
	Attn Part
	FFN  Part
	MoE  Part
}

// FFNAt is the feed-forward part of layer l under these dims, nil when
// the architecture has none for it (an MoE architecture without experts).
func (a *Arch) FFNAt(d Dims, l int) Part {
	if a.MoE != nil && d.Experts > 0 && l >= d.DenseLead {
		return a.MoE
	}
	return a.FFN
}

// BlockAt is layer l's tensors under these dims, attention part first.
func (a *Arch) BlockAt(d Dims, l int) []Tensor {
	out := a.Attn.Tensors()
	if f := a.FFNAt(d, l); f != nil {
		out = append(out, f.Tensors()...)
	}
	return out
}

// Block is every tensor a layer of the architecture may have, attention
// part first (the dense and the MoE feed-forward parts both, each name
// once): the list name lookups search.
func (a *Arch) Block() []Tensor {
	out := a.Attn.Tensors()
	seen := map[string]bool{}
	for _, t := range out {
		seen[t.Name] = true
	}
	for _, p := range []Part{a.FFN, a.MoE} {
		if p == nil {
			continue
		}
		for _, t := range p.Tensors() {
			if !seen[t.Name] {
				seen[t.Name] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// Globals are the tensors outside the blocks, shared by every architecture
// declared so far.
func (a *Arch) Globals() []Tensor {
	return []Tensor{
		{Name: "token_embd.weight", HF: "model.embed_tokens.weight", Role: TokenEmbd, Shape: embdShape, Split: Vocab},
		{Name: "output_norm.weight", HF: "model.norm.weight", Role: OutputNorm, Shape: vec(func(d Dims) int { return d.Embd }), Split: Replicated},
		{Name: "output.weight", HF: "lm_head.weight", Role: Output, Shape: embdShape, When: untied, Split: Vocab},
	}
}

func embdShape(d Dims) []int { return []int{d.Embd, d.Vocab} }
func untied(d Dims) bool     { return !d.Tied }

// Named is a declared tensor under its full GGUF name.
type Named struct {
	Name  string
	Layer int // -1 outside the blocks
	Tensor
}

// Tensors lists every tensor of a model with these dims and layers in the
// order the GGUF converters write them: the token embedding, the blocks,
// then the output head. Optional tensors are included.
func (a *Arch) Tensors(d Dims, layers int) []Named {
	g := a.Globals()
	var out []Named
	add := func(layer int, name string, t Tensor) {
		if t.In(d) {
			out = append(out, Named{Name: name, Layer: layer, Tensor: t})
		}
	}
	add(-1, g[0].Name, g[0])
	for l := 0; l < layers; l++ {
		for _, t := range a.BlockAt(d, l) {
			add(l, BlockName(l, t.Name), t)
		}
	}
	for _, t := range g[1:] {
		add(-1, t.Name, t)
	}
	return out
}

// BlockName is the GGUF name of layer l's tensor suffix.
func BlockName(l int, suffix string) string { return fmt.Sprintf("blk.%d.%s", l, suffix) }

// Find returns the declaration of a GGUF tensor name (blk.N.suffix or a
// global name).
func (a *Arch) Find(name string) (Tensor, bool) {
	if _, suffix, ok := SplitLayer(name, "blk."); ok {
		for _, t := range a.Block() {
			if t.Name == suffix {
				return t, true
			}
		}
		return Tensor{}, false
	}
	for _, t := range a.Globals() {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// ByRole returns the declaration of the tensor with role r.
func (a *Arch) ByRole(r Role) (Tensor, bool) {
	for _, t := range append(a.Globals(), a.Block()...) {
		if t.Role == r {
			return t, true
		}
	}
	return Tensor{}, false
}

// BlockOrder is the position of a block tensor (GGUF name without
// "blk.N.") in Block; unknown names come after all known ones.
func (a *Arch) BlockOrder(suffix string) int {
	b := a.Block()
	for i, t := range b {
		if t.Name == suffix {
			return i
		}
	}
	return len(b)
}

// Params counts the weights of a model with these dims (optional tensors
// left out, the embedding once when tied).
func (a *Arch) Params(d Dims, layers int) int64 {
	var n int64
	for _, t := range a.Tensors(d, layers) {
		if t.Optional {
			continue
		}
		p := int64(1)
		for _, x := range t.Shape(d) {
			p *= int64(x)
		}
		n += p
	}
	return n
}

// GGUFName maps a Hugging Face tensor name (model.layers.3.self_attn.q_proj.weight)
// to its GGUF name (blk.3.attn_q.weight).
func (a *Arch) GGUFName(hfName string) (string, bool) { return a.mapName(hfName, true) }

// HFName maps a GGUF tensor name to the Hugging Face name it is stored under.
func (a *Arch) HFName(ggufName string) (string, bool) { return a.mapName(ggufName, false) }

func (a *Arch) mapName(name string, toGGUF bool) (string, bool) {
	pick := func(t Tensor) (from, to string) {
		if toGGUF {
			return t.HF, t.Name
		}
		return t.Name, t.HF
	}
	for _, t := range a.Globals() {
		if from, to := pick(t); from == name {
			return to, true
		}
	}
	fromPrefix, toPrefix := "blk.", "model.layers."
	if toGGUF {
		fromPrefix, toPrefix = toPrefix, fromPrefix
	}
	layer, suffix, ok := SplitLayer(name, fromPrefix)
	if !ok {
		return "", false
	}
	for _, t := range a.Block() {
		if from, to := pick(t); from == suffix && from != "" && to != "" {
			return toPrefix + layer + "." + to, true
		}
	}
	return "", false
}

// SplitLayer splits prefix + "N." + suffix, N decimal digits.
func SplitLayer(name, prefix string) (layer, suffix string, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return "", "", false
	}
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return "", "", false
	}
	for _, c := range rest[:i] {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	return rest[:i], rest[i+1:], true
}

// registry holds every declared architecture; it is filled by init
// functions only and read-only afterwards.
var registry []*Arch

// Register adds an architecture. It is meant for init functions; a name
// declared twice is a programming error.
func Register(a *Arch) {
	for _, n := range append([]string{a.Name}, a.Aliases...) {
		if Lookup(n) != nil {
			panic("arch: " + n + " registered twice")
		}
	}
	registry = append(registry, a)
}

// Lookup returns the architecture a GGUF general.architecture names, or nil.
func Lookup(ggufArch string) *Arch {
	for _, a := range registry {
		if a.Name == ggufArch || contains(a.Aliases, ggufArch) {
			return a
		}
	}
	return nil
}

// LookupHF returns the architecture of a config.json model_type, or nil.
func LookupHF(modelType string) *Arch {
	for _, a := range registry {
		if contains(a.HFTypes, modelType) {
			return a
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Names lists the GGUF architecture names that load, aliases included,
// sorted, for messages.
func Names() []string {
	var out []string
	for _, a := range registry {
		out = append(out, a.Name)
		out = append(out, a.Aliases...)
	}
	sort.Strings(out)
	return out
}

// HFNames lists the supported config.json model_type values, sorted.
func HFNames() []string {
	var out []string
	for _, a := range registry {
		out = append(out, a.HFTypes...)
	}
	sort.Strings(out)
	return out
}

// RoleOf finds a GGUF tensor name among every registered architecture's
// declarations.
func RoleOf(name string) (Role, bool) {
	for _, a := range registry {
		if t, ok := a.Find(name); ok {
			return t.Role, true
		}
	}
	return 0, false
}

func vec(n func(Dims) int) func(Dims) []int {
	return func(d Dims) []int { return []int{n(d)} }
}

func mat(cols, rows func(Dims) int) func(Dims) []int {
	return func(d Dims) []int { return []int{cols(d), rows(d)} }
}

func stack(cols, rows, n func(Dims) int) func(Dims) []int {
	return func(d Dims) []int { return []int{cols(d), rows(d), n(d)} }
}
