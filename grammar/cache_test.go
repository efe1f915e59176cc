package grammar

import (
	"context"
	"encoding/hex"
	"testing"
)

// TestSpecKey: a spec's key is a pure function of its fields (a fixed
// value, so every process and every restart agrees on it), and moving text
// from one field to the next changes it.
func TestSpecKey(t *testing.T) {
	s := Spec{Kind: KindJSONSchema, Schema: `{"type":"integer"}`, Prefix: "<tool_call>", Suffix: "</tool_call>"}
	if s.Key() != s.Key() {
		t.Fatal("key not stable")
	}
	// Pinned: a change here breaks agreement with every cache keyed
	// before it.
	if got := hex.EncodeToString(func() []byte { k := (Spec{Kind: KindJSONObject}).Key(); return k[:] }()); got != jsonObjectKey {
		t.Errorf("json_object key %s, want %s", got, jsonObjectKey)
	}
	seen := map[[32]byte]Spec{}
	for _, v := range []Spec{
		s, {Kind: KindJSONSchema, Schema: `{"type":"integer"}<tool_call>`, Suffix: "</tool_call>"},
		{Kind: KindJSONSchema, Schema: `{"type":"integer"}`, Prefix: "<tool_call></tool_call>"},
		{Kind: KindJSONObject}, {Kind: KindJSONSchema}, {Kind: "", Schema: KindJSONObject},
	} {
		if o, dup := seen[v.Key()]; dup {
			t.Fatalf("%+v and %+v share a key", o, v)
		}
		seen[v.Key()] = v
	}
}

// TestSpecCompile: each kind compiles; what a kind does not take, and an
// unknown kind, are errors.
func TestSpecCompile(t *testing.T) {
	ctx := context.Background()
	for _, s := range []Spec{{Kind: KindJSONObject}, {Kind: KindJSONSchema, Schema: `{"type":"integer"}`, Prefix: "<a>", Suffix: "</a>"}} {
		if g, err := s.Compile(ctx, Limits{}); g == nil || err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	for _, s := range []Spec{{Kind: KindJSONObject, Schema: "{}"}, {Kind: KindJSONObject, Prefix: "x"}, {Kind: "regex", Schema: "a+"}, {Kind: KindJSONSchema, Schema: "{"}} {
		if _, err := s.Compile(ctx, Limits{}); err == nil {
			t.Errorf("%+v compiled", s)
		}
	}
}

const jsonObjectKey = "2660c2cdc355d5fc2ed1311607ebad77d3f444f92a04e06e2586c3cab041c15f"
