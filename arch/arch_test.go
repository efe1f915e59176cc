package arch

import (
	"reflect"
	"testing"
)

func TestNamesRoundTrip(t *testing.T) {
	a := Lookup("qwen2")
	if n := len(a.Block()); n != 12 {
		t.Fatalf("qwen2: %d block tensors, want 12", n)
	}
	for _, layer := range []string{"0", "7", "31", "123"} {
		for i, m := range a.Block() {
			hfn := "model.layers." + layer + "." + m.HF
			gn := "blk." + layer + "." + m.Name
			got, ok := a.GGUFName(hfn)
			if !ok || got != gn {
				t.Errorf("GGUFName(%q) = %q, %v; want %q", hfn, got, ok, gn)
			}
			back, ok := a.HFName(got)
			if !ok || back != hfn {
				t.Errorf("HFName(%q) = %q, %v; want %q", got, back, ok, hfn)
			}
			if o := a.BlockOrder(m.Name); o != i {
				t.Errorf("BlockOrder(%q) = %d, want %d", m.Name, o, i)
			}
		}
	}
	for hfn, gn := range map[string]string{
		"model.embed_tokens.weight": "token_embd.weight",
		"model.norm.weight":         "output_norm.weight",
		"lm_head.weight":            "output.weight",
	} {
		if got, ok := a.GGUFName(hfn); !ok || got != gn {
			t.Errorf("GGUFName(%q) = %q, %v; want %q", hfn, got, ok, gn)
		}
		if got, ok := a.HFName(gn); !ok || got != hfn {
			t.Errorf("HFName(%q) = %q, %v; want %q", gn, got, ok, hfn)
		}
	}
	// The converter writes a block in llama.cpp's order.
	order := []string{"attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
		"attn_v.bias", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
	for i := 1; i < len(order); i++ {
		if a.BlockOrder(order[i-1]) >= a.BlockOrder(order[i]) {
			t.Errorf("%s does not come before %s", order[i-1], order[i])
		}
	}
	if o := a.BlockOrder("ffn_gate_exps.weight"); o != len(a.Block()) {
		t.Errorf("unknown tensor ranks %d, want %d", o, len(a.Block()))
	}
	for _, bad := range []string{"", "model.layers.0", "model.layers..self_attn.q_proj.weight", "model.layers.x.self_attn.q_proj.weight",
		"model.layers.-1.self_attn.q_proj.weight", "model.layers.0.self_attn.rotary_emb.inv_freq", "layers.0.mlp.up_proj.weight",
		"blk.0.attn_q.weight", "transformer.wte.weight", "model.layers.0.self_attn.q_norm.weight"} {
		if got, ok := a.GGUFName(bad); ok {
			t.Errorf("GGUFName(%q) = %q, want none", bad, got)
		}
	}
	for _, bad := range []string{"", "blk.0", "blk..attn_q.weight", "blk.+1.attn_q.weight", "blk.0.ffn_gate_exps.weight",
		"rope_freqs.weight", "model.layers.0.self_attn.q_proj.weight"} {
		if got, ok := a.HFName(bad); ok {
			t.Errorf("HFName(%q) = %q, want none", bad, got)
		}
	}
}

func TestLookup(t *testing.T) {
	for name, want := range map[string]string{"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"} {
		if a := Lookup(name); a == nil || a.Name != want {
			t.Errorf("Lookup(%q) = %v, want %s", name, a, want)
		}
		if a := LookupHF(name); a == nil || a.Name != want {
			t.Errorf("LookupHF(%q) = %v, want %s", name, a, want)
		}
	}
	if Lookup("gpt2") != nil || LookupHF("gpt2") != nil {
		t.Error("gpt2 found")
	}
	if got, want := Names(), []string{"deepseek2", "llama", "mistral", "olmoe", "qwen2", "qwen2moe", "qwen3", "qwen3moe"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
}

// The declared tensors of each architecture under small dims: names in
// converter order, shapes in ggml order, conditional tensors resolved.
func TestTensors(t *testing.T) {
	d := Dims{Embd: 8, Heads: 4, KVHeads: 2, HeadDim: 4, FFN: 12, Vocab: 10}
	type nt struct {
		name  string
		shape []int
	}
	list := func(a *Arch, d Dims) []nt {
		var out []nt
		for _, t := range a.Tensors(d, 1) {
			out = append(out, nt{t.Name, t.Shape(d)})
		}
		return out
	}
	head := []nt{{"token_embd.weight", []int{8, 10}}, {"blk.0.attn_norm.weight", []int{8}}, {"blk.0.attn_q.weight", []int{8, 16}}}
	tail := []nt{{"blk.0.ffn_norm.weight", []int{8}}, {"blk.0.ffn_gate.weight", []int{8, 12}}, {"blk.0.ffn_up.weight", []int{8, 12}},
		{"blk.0.ffn_down.weight", []int{12, 8}}, {"output_norm.weight", []int{8}}}
	kv := []nt{{"blk.0.attn_k.weight", []int{8, 8}}, {"blk.0.attn_v.weight", []int{8, 8}}}
	out := nt{"blk.0.attn_output.weight", []int{16, 8}}
	join := func(parts ...[]nt) []nt {
		var r []nt
		for _, p := range parts {
			r = append(r, p...)
		}
		return r
	}
	llama := join(head, kv, []nt{out}, tail, []nt{{"output.weight", []int{8, 10}}})
	if got := list(Lookup("llama"), d); !reflect.DeepEqual(got, llama) {
		t.Errorf("llama:\n got %v\nwant %v", got, llama)
	}
	tied := d
	tied.Tied, tied.Bias = true, true
	llamaBias := join(head, []nt{{"blk.0.attn_q.bias", []int{16}}, kv[0], {"blk.0.attn_k.bias", []int{8}}, kv[1],
		{"blk.0.attn_v.bias", []int{8}}, out}, tail)
	if got := list(Lookup("llama"), tied); !reflect.DeepEqual(got, llamaBias) {
		t.Errorf("llama with attention_bias, tied:\n got %v\nwant %v", got, llamaBias)
	}
	if got := list(Lookup("qwen2"), d); !reflect.DeepEqual(got, join(llamaBias, []nt{{"output.weight", []int{8, 10}}})) {
		t.Errorf("qwen2: %v", got)
	}
	qwen3 := join(head, kv, []nt{{"blk.0.attn_q_norm.weight", []int{4}}, {"blk.0.attn_k_norm.weight", []int{4}}, out}, tail)
	if got := list(Lookup("qwen3"), tied); !reflect.DeepEqual(got, qwen3) {
		t.Errorf("qwen3:\n got %v\nwant %v", got, qwen3)
	}
	// 8·10 + 8 + 10·8 embedding, norm, output; per layer 8 + 8·16 + 2·8·8 + 16·8 + 8 + 3·8·12.
	if p, want := Lookup("llama").Params(d, 2), int64(80+8+80+2*(8+128+128+128+8+288)); p != want {
		t.Errorf("Params = %d, want %d", p, want)
	}
	if r, ok := RoleOf("blk.4.attn_k_norm.weight"); !ok || r != AttnKNorm {
		t.Errorf("RoleOf(attn_k_norm) = %v, %v", r, ok)
	}
}

// The per-layer parts of the MoE and MLA architectures: deepseek2's
// leading dense layer, its MLA tensors with and without the low-rank
// query, qwen2moe's gated shared expert, llama with and without experts.
func TestMoETensors(t *testing.T) {
	names := func(a *Arch, d Dims, l int) []string {
		var out []string
		for _, t := range a.BlockAt(d, l) {
			if t.In(d) {
				out = append(out, t.Name)
			}
		}
		return out
	}
	d := Dims{Embd: 16, Heads: 2, KVHeads: 1, FFN: 24, Vocab: 10, Experts: 4, ExpertFFN: 8, SharedFFN: 8, DenseLead: 1,
		QLoRA: 12, KVLoRA: 8, QKNope: 4, QKRope: 2, VHead: 4}
	ds := Lookup("deepseek2")
	mla := []string{"attn_norm.weight", "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
		"attn_kv_a_norm.weight", "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight"}
	dense := append(append([]string{}, mla...), "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
	if got := names(ds, d, 0); !reflect.DeepEqual(got, dense) {
		t.Errorf("deepseek2 layer 0:\n got %v\nwant %v", got, dense)
	}
	moe := append(append([]string{}, mla...), "ffn_norm.weight", "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight",
		"ffn_down_exps.weight", "ffn_up_exps.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight", "ffn_up_shexp.weight")
	if got := names(ds, d, 1); !reflect.DeepEqual(got, moe) {
		t.Errorf("deepseek2 layer 1:\n got %v\nwant %v", got, moe)
	}
	for _, tn := range ds.Tensors(d, 2) {
		switch tn.Name {
		case "blk.1.attn_k_b.weight":
			if s := tn.Shape(d); !reflect.DeepEqual(s, []int{4, 8, 2}) {
				t.Errorf("attn_k_b shape %v", s)
			}
		case "blk.1.ffn_down_exps.weight":
			if s := tn.Shape(d); !reflect.DeepEqual(s, []int{8, 16, 4}) {
				t.Errorf("ffn_down_exps shape %v", s)
			}
		case "blk.1.attn_q_b.weight":
			if s := tn.Shape(d); !reflect.DeepEqual(s, []int{12, 12}) {
				t.Errorf("attn_q_b shape %v", s)
			}
		}
	}
	lite := d
	lite.QLoRA = 0
	if got := names(ds, lite, 1)[1]; got != "attn_q.weight" {
		t.Errorf("deepseek2 without q_lora: %s, want attn_q.weight", got)
	}
	old := lite
	old.KVBCombined = true
	if got := names(ds, old, 0)[4]; got != "attn_kv_b.weight" {
		t.Errorf("deepseek2 with attn_kv_b: %v", names(ds, old, 0))
	}
	q2 := names(Lookup("qwen2moe"), d, 1)
	if !reflect.DeepEqual(q2[len(q2)-4:], []string{"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight", "ffn_up_shexp.weight"}) {
		t.Errorf("qwen2moe: %v", q2)
	}
	noShared := d
	noShared.SharedFFN = 0
	if q3 := names(Lookup("qwen3moe"), noShared, 1); q3[len(q3)-1] != "ffn_up_exps.weight" {
		t.Errorf("qwen3moe: %v", q3)
	}
	llama := Lookup("llama")
	if got := names(llama, noShared, 1); got[len(got)-1] != "ffn_up_exps.weight" {
		t.Errorf("mixtral: %v", got)
	}
	d.Experts = 0
	if got := names(llama, d, 0); got[len(got)-1] != "ffn_down.weight" {
		t.Errorf("llama: %v", got)
	}
	if Lookup("qwen3moe").FFNAt(d, 0) != nil {
		t.Error("qwen3moe without experts has a feed-forward part")
	}
	if r, ok := RoleOf("blk.3.ffn_gate_exps.weight"); !ok || r != FFNGateExps {
		t.Errorf("RoleOf(ffn_gate_exps) = %v, %v", r, ok)
	}
	// Experts have no HF name: GGUF → HF maps nothing.
	if got, ok := llama.HFName("blk.0.ffn_up_exps.weight"); ok {
		t.Errorf("HFName(ffn_up_exps) = %q", got)
	}
}

// Every tensor of every architecture declares how it splits across
// tensor-parallel ranks, and the split fits its shape: a vector splits
// only with the rows of the matrix it belongs to, a stack only by its
// matrices.
func TestSplitsDeclared(t *testing.T) {
	d := Dims{Embd: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 96, Vocab: 100, Bias: true,
		Experts: 4, ExpertFFN: 32, SharedFFN: 32, QLoRA: 16, KVLoRA: 32, QKNope: 8, QKRope: 8, VHead: 8}
	for _, name := range Names() {
		a := Lookup(name)
		for _, combined := range []bool{false, true} {
			d.KVBCombined = combined
			for _, nt := range a.Tensors(d, 2) {
				s, n := nt.Split, len(nt.Shape(d))
				switch {
				case s < Replicated || s > Expert:
					t.Errorf("%s %s: split %v not declared", name, nt.Name, s)
				case s == Expert && n != 3:
					t.Errorf("%s %s: expert split on a %d-D tensor", name, nt.Name, n)
				case (s == Row || s == Vocab) && n != 2:
					t.Errorf("%s %s: %v split on a %d-D tensor", name, nt.Name, s, n)
				}
			}
		}
	}
}
