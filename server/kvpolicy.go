package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"pagoda/engine"
	"pagoda/kvcache"
)

// parseKVPolicy reads the kv_policy body field (Pagoda's extension): the
// KV cache policy of this request, in the --kv-policy string form
// ("quest:budget=1024") or as an object whose "name" is the policy and
// whose other keys are its settings ({"name": "quest", "budget": 1024});
// "none" (or {"name": "none"}) is full attention even where the server
// has a default policy. Absent or null leaves the server's (""). The
// result is the policy's spec string, checked here so that a bad one is a
// 400 naming the field; the engine parses it again on its side.
func parseKVPolicy(raw json.RawMessage) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var spec string
	switch raw[0] {
	case '"':
		if err := json.Unmarshal(raw, &spec); err != nil {
			return "", badRequest("kv_policy", "kv_policy: %v", err)
		}
		if strings.TrimSpace(spec) == "" {
			return "", badRequest("kv_policy", `kv_policy is empty (use "none" for full attention)`)
		}
	case '{':
		var err *apiError
		if spec, err = kvPolicyObject(raw); err != nil {
			return "", err
		}
	default:
		return "", badRequest("kv_policy", `kv_policy must be a string such as "quest:budget=1024" or an object such as {"name": "quest", "budget": 1024}, got %s`, jsonKindOf(raw))
	}
	if _, err := kvcache.ParsePolicy(spec); err != nil {
		return "", badRequest("kv_policy", "kv_policy: %s", strings.TrimPrefix(err.Error(), "kvcache: "))
	}
	return spec, nil
}

// kvPolicyObject turns the object form into the string form, refusing
// anything the string form could not say unambiguously.
func kvPolicyObject(raw json.RawMessage) (string, *apiError) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return "", badRequest("kv_policy", "kv_policy: %v", err)
	}
	name, ok := m["name"].(string)
	if !ok {
		return "", badRequest("kv_policy", `kv_policy needs "name": a string such as "quest", "h2o", "snapkv", "streaming" or "none"`)
	}
	delete(m, "name")
	if name = strings.TrimSpace(name); name == "" || strings.ContainsAny(name, ":,=") {
		return "", badRequest("kv_policy", "kv_policy: bad policy name %q", name)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sets []string
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, ":,= ") {
			return "", badRequest("kv_policy", "kv_policy: bad setting name %q", k)
		}
		var v string
		switch x := m[k].(type) {
		case json.Number:
			v = x.String()
		case string:
			v = x
			if v == "" || strings.ContainsAny(v, ":,=") {
				return "", badRequest("kv_policy", "kv_policy: bad value %q for %q", v, k)
			}
		default:
			return "", badRequest("kv_policy", "kv_policy: %q must be a number or a string", k)
		}
		sets = append(sets, k+"="+v)
	}
	if len(sets) == 0 {
		return name, nil
	}
	return name + ":" + strings.Join(sets, ","), nil
}

// jsonKindOf names the JSON type of a value for an error message.
func jsonKindOf(raw json.RawMessage) string {
	switch {
	case len(raw) == 0:
		return "nothing"
	case raw[0] == '[':
		return "a list"
	case raw[0] == 't' || raw[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// kvPolicyError is the 400 for a policy the engine refuses at Submit (one
// its cache cannot run: a streaming policy without the model's rotary
// embedding, a window other than the model's).
func kvPolicyError(err error) *apiError {
	if !errors.Is(err, engine.ErrBadKVPolicy) {
		return nil
	}
	return badRequest("kv_policy", "kv_policy: %v", err)
}
