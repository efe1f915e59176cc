package convert

import (
	"fmt"
	"strconv"
	"strings"

	"pagoda/arch"
	"pagoda/quant"
)

// This file ports llama.cpp's per-tensor type selection (src/llama-quant.cpp:
// tensor_allows_quantization, llama_tensor_get_type(_impl),
// tensor_type_fallback). The counters advance in the order llama-quantize
// visits tensors (weightNameLess), so layers are picked exactly as there.

type category int

const (
	catOther category = iota
	catTokenEmbd
	catAttnQ
	catAttnV
	catAttnK
	catAttnQKV
	catAttnKVB
	catAttnOutput
	catFFNUp
	catFFNGate
	catFFNDown
	catOutput
)

// tensorCategory takes a declared tensor's category from its role (package
// arch); other names, from architectures Pagoda does not run, by
// llama.cpp's name fragments.
func tensorCategory(name string) category {
	if r, ok := arch.RoleOf(name); ok {
		return roleCategory(r)
	}
	return fragmentCategory(name)
}

// fragmentCategory is llama.cpp's name test.
func fragmentCategory(name string) category {
	switch {
	case name == "output.weight":
		return catOutput
	case name == "token_embd.weight" || name == "per_layer_token_embd.weight":
		return catTokenEmbd
	case strings.Contains(name, "attn_qkv.weight"):
		return catAttnQKV
	case strings.Contains(name, "attn_kv_b.weight"):
		return catAttnKVB
	case strings.Contains(name, "attn_v.weight"):
		return catAttnV
	case strings.Contains(name, "attn_k.weight"):
		return catAttnK
	case strings.Contains(name, "attn_q.weight"):
		return catAttnQ
	case strings.Contains(name, "attn_output.weight"):
		return catAttnOutput
	case strings.Contains(name, "ffn_up"):
		return catFFNUp
	case strings.Contains(name, "ffn_gate"):
		return catFFNGate
	case strings.Contains(name, "ffn_down"):
		return catFFNDown
	}
	return catOther
}

func roleCategory(r arch.Role) category {
	switch r {
	case arch.TokenEmbd:
		return catTokenEmbd
	case arch.Output:
		return catOutput
	case arch.AttnQ:
		return catAttnQ
	case arch.AttnK:
		return catAttnK
	case arch.AttnV:
		return catAttnV
	case arch.AttnOut:
		return catAttnOutput
	case arch.FFNGate:
		return catFFNGate
	case arch.FFNUp:
		return catFFNUp
	case arch.FFNDown:
		return catFFNDown
	}
	return catOther
}

func (c category) isAttnV() bool { return c == catAttnV || c == catAttnQKV || c == catAttnKVB }

// nDims is ggml_n_dims: trailing dimensions of size 1 do not count.
func nDims(dims []uint64) int {
	for i := len(dims) - 1; i >= 1; i-- {
		if dims[i] > 1 {
			return i + 1
		}
	}
	return 1
}

// noQuantize lists name fragments llama.cpp never quantizes: small or
// precision-sensitive tensors of other architectures, kept so that such
// files come out as llama-quantize would make them.
var noQuantize = []string{
	"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
	"per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
	"indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
	"time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
	"time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
	"time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
	"time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
	".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
	".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
}

// allowsQuantization is tensor_allows_quantization: 2-D and higher weights,
// not norms, gates of experts and a few small special tensors. 1-D tensors
// (norms, biases, rope_freqs) keep their type.
func allowsQuantization(name string, dims []uint64) bool {
	if nDims(dims) < 2 || !strings.HasSuffix(name, "weight") {
		return false
	}
	for _, s := range noQuantize {
		if strings.Contains(name, s) {
			return false
		}
	}
	return name != "position_embd.weight" && name != "token_types.weight"
}

// layerOf mirrors sscanf(name, "blk.%d.", &n): the layer index, or -1.
func layerOf(name string) int {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return -1
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || i >= len(rest) || rest[i] != '.' {
		return -1
	}
	n, err := strconv.Atoi(rest[:i])
	if err != nil {
		return -1
	}
	return n
}

// weightNameLess is llama-model-loader's weight_name_comparer: by layer (no
// layer first), then by name. llama-quantize visits and writes tensors in
// this order, which is what its layer counters count.
func weightNameLess(a, b string) bool {
	la, lb := layerOf(a), layerOf(b)
	if la != lb {
		return la < lb
	}
	return a < b
}

func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// hparams are the model facts the mixes look at.
type hparams struct {
	arch                   string
	nLayer, nHead, nHeadKV int
	nExpert                int
}

func (h hparams) gqa() int {
	if h.nHeadKV == 0 {
		return 0
	}
	return h.nHead / h.nHeadKV
}

// is70B is llama.cpp's LLM_TYPE_70B: an 80-layer llama with grouped KV.
func (h hparams) is70B() bool {
	return h.arch == "llama" && h.nLayer == 80 && h.nHead != h.nHeadKV
}

// planner chooses each tensor's type; call target in weightNameLess order.
type planner struct {
	ft                 *fileType
	pure               bool
	outType, embdType  quant.Type // 0 = per mix
	hp                 hparams
	tied               bool
	nAttnV, iAttnV     int
	nFFNDown, iFFNDown int
	iFFNGate, iFFNUp   int
	fallbacks          int
}

func newPlanner(ft *fileType, pure bool, outType, embdType quant.Type, hp hparams, names []string) *planner {
	p := &planner{ft: ft, pure: pure, outType: outType, embdType: embdType, hp: hp, tied: true}
	for _, n := range names {
		c := tensorCategory(n)
		if c.isAttnV() {
			p.nAttnV++
		}
		if c == catOutput {
			p.tied = false
		}
	}
	p.nFFNDown = hp.nLayer
	return p
}

func isQuantized(t quant.Type) bool { return t.BlockSize() > 1 }

// target is llama_tensor_get_type.
func (p *planner) target(name string, typ quant.Type, dims []uint64) (quant.Type, error) {
	if !allowsQuantization(name, dims) {
		return typ, nil
	}
	cat := tensorCategory(name)
	if p.embdType != 0 && cat == catTokenEmbd {
		return p.fallback(p.embdType, dims)
	}
	if p.outType != 0 && cat == catOutput {
		return p.fallback(p.outType, dims)
	}
	t := p.ft.base
	if !isQuantized(t) {
		return t, nil
	}
	if !p.pure {
		var err error
		if t, err = p.impl(t, name, dims, cat); err != nil {
			return 0, err
		}
	}
	return p.fallback(t, dims)
}

// fallback is tensor_type_fallback: a row length that is not a whole number
// of blocks moves to a type with 32-element blocks, else to F16. llama.cpp
// refuses the 32-block types outright there; F16 keeps such a model usable.
func (p *planner) fallback(t quant.Type, dims []uint64) (quant.Type, error) {
	n := dims[0]
	if n%uint64(t.BlockSize()) == 0 {
		return t, nil
	}
	p.fallbacks++
	r := quant.F16
	switch t {
	case quant.IQ1_S, quant.IQ1_M, quant.IQ2_XXS, quant.IQ2_XS, quant.IQ2_S, quant.IQ3_XXS, quant.IQ3_S, quant.IQ4_XS:
		r = quant.IQ4_NL
	case quant.Q2_K, quant.Q3_K, quant.TQ1_0, quant.TQ2_0:
		r = quant.Q4_0
	case quant.Q4_K:
		r = quant.Q5_0
	case quant.Q5_K:
		r = quant.Q5_1
	case quant.Q6_K:
		r = quant.Q8_0
	}
	if n%uint64(r.BlockSize()) != 0 {
		r = quant.F16
	}
	return r, nil
}

// layerInfo returns the layer a counter stands for; with experts the
// tensors of a layer are not consecutive, so the name decides.
func (p *planner) layerInfo(i, n int, name string) (int, int, error) {
	if p.hp.nExpert > 1 {
		l := layerOf(name)
		if l < 0 || l >= n {
			return 0, 0, fmt.Errorf("convert: tensor %q: cannot tell its layer (of %d)", name, n)
		}
		return l, n, nil
	}
	return i, n, nil
}

// impl is llama_tensor_get_type_impl for the file types Pagoda writes
// (no importance matrix, so the IQ1/IQ2/IQ3 arms never run).
func (p *planner) impl(t quant.Type, name string, dims []uint64, cat category) (quant.Type, error) {
	ft := p.ft.id
	hp := p.hp
	falcon := hp.arch == "falcon"
	switch {
	case cat == catOutput || (p.tied && cat == catTokenEmbd):
		if p.outType != 0 {
			return p.outType, nil
		}
		if falcon || dims[0]%uint64(t.BlockSize()) != 0 {
			return quant.Q8_0, nil
		}
		if t != quant.Q8_0 {
			return quant.Q6_K, nil
		}
	case cat == catTokenEmbd:
		// Only the IQ1/IQ2/IQ3/TQ file types change token_embd.
	case cat.isAttnV():
		t = p.attnVType(t)
	case cat == catAttnK:
		if hp.nExpert == 8 {
			t = quant.Q8_0
		}
	case cat == catFFNDown:
		return p.ffnDownType(t, name)
	case cat == catAttnOutput:
		if !falcon {
			if hp.nExpert == 8 {
				switch ft {
				case ftQ2_K, ftQ3_K_S, ftQ3_K_M, ftIQ4_NL, ftQ4_K_S, ftQ4_K_M, ftIQ4_XS:
					t = quant.Q5_K
				}
			} else {
				switch ft {
				case ftQ2_K:
					t = quant.Q3_K
				case ftQ3_K_M:
					t = quant.Q4_K
				case ftQ3_K_L:
					t = quant.Q5_K
				}
			}
		} else if ft == ftQ3_K_L {
			t = quant.Q4_K
		}
	case cat == catAttnQKV:
		switch ft {
		case ftQ3_K_M, ftQ3_K_L:
			t = quant.Q4_K
		case ftQ4_K_M:
			t = quant.Q5_K
		case ftQ5_K_M:
			t = quant.Q6_K
		}
	case cat == catFFNGate:
		if _, _, err := p.layerInfo(p.iFFNGate, p.nFFNDown, name); err != nil {
			return 0, err
		}
		p.iFFNGate++
	case cat == catFFNUp:
		if _, _, err := p.layerInfo(p.iFFNUp, p.nFFNDown, name); err != nil {
			return 0, err
		}
		p.iFFNUp++
	}
	return t, nil
}

// attnVType is impl's attn_v arm: the value projection gets more bits in
// the mixes that can afford them, since its errors reach every head.
func (p *planner) attnVType(t quant.Type) quant.Type {
	ft, hp := p.ft.id, p.hp
	switch {
	case ft == ftQ2_K:
		t = quant.Q3_K
		if hp.gqa() >= 4 {
			t = quant.Q4_K
		}
	case ft == ftQ3_K_M:
		t = quant.Q4_K
		if p.iAttnV < 2 {
			t = quant.Q5_K
		}
	case ft == ftQ3_K_L:
		t = quant.Q5_K
	case (ft == ftIQ4_NL || ft == ftIQ4_XS) && hp.gqa() >= 4:
		t = quant.Q5_K
	case (ft == ftQ4_K_M || ft == ftQ5_K_M) && useMoreBits(p.iAttnV, p.nAttnV):
		t = quant.Q6_K
	case ft == ftQ4_K_S && p.iAttnV < 4:
		t = quant.Q5_K
	}
	if hp.is70B() && (t == quant.Q3_K || t == quant.Q4_K) {
		t = quant.Q5_K
	}
	if hp.nExpert == 8 {
		t = quant.Q8_0
	}
	p.iAttnV++
	return t
}

// ffnDownType is impl's ffn_down arm, which depends on the layer's place
// in the stack.
func (p *planner) ffnDownType(t quant.Type, name string) (quant.Type, error) {
	ft, hp := p.ft.id, p.hp
	falcon := hp.arch == "falcon"
	i, n, err := p.layerInfo(p.iFFNDown, p.nFFNDown, name)
	if err != nil {
		return 0, err
	}
	switch {
	case ft == ftQ2_K:
		t = quant.Q3_K
	case ft == ftQ3_K_M:
		switch {
		case i < n/16:
			t = quant.Q5_K
		case !falcon || useMoreBits(i, n):
			t = quant.Q4_K
		default:
			t = quant.Q3_K
		}
	case ft == ftQ3_K_L:
		t = quant.Q5_K
		if falcon {
			t = quant.Q4_K
		}
	case ft == ftQ4_K_M:
		if falcon {
			switch {
			case i < n/16:
				t = quant.Q6_K
			case useMoreBits(i, n):
				t = quant.Q5_K
			default:
				t = quant.Q4_K
			}
		} else if useMoreBits(i, n) {
			t = quant.Q6_K
		}
	case i < n/8 && (ft == ftIQ4_NL || ft == ftIQ4_XS):
		t = quant.Q5_K
	case ft == ftQ5_K_M && useMoreBits(i, n):
		t = quant.Q6_K
	case ft == ftQ4_K_S && !falcon && i < n/8:
		t = quant.Q5_K
	}
	p.iFFNDown++
	return t, nil
}
