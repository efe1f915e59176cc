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
	if got, want := Names(), []string{"llama", "mistral", "qwen2", "qwen3"}; !reflect.DeepEqual(got, want) {
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
