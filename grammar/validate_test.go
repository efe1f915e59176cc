package grammar

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"unicode/utf8"
)

// validate checks doc against schema for the subset of JSON Schema the
// compiler supports; both are encoding/json values (numbers float64).
func validate(doc, schema, root any) error {
	switch s := schema.(type) {
	case bool:
		if !s {
			return fmt.Errorf("false schema")
		}
		return nil
	case map[string]any:
		return validateObj(doc, s, root)
	}
	return fmt.Errorf("bad schema %v", schema)
}

func resolve(root any, ref string) any {
	cur := root
	if ref == "#" {
		return cur
	}
	for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		p = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
		cur = cur.(map[string]any)[p]
	}
	return cur
}

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "?"
}

func validateObj(doc any, s map[string]any, root any) error {
	if r, ok := s["$ref"].(string); ok {
		return validate(doc, resolve(root, r), root)
	}
	if a, ok := s["allOf"].([]any); ok {
		for _, sub := range a {
			if err := validate(doc, sub, root); err != nil {
				return err
			}
		}
	}
	if a, ok := s["anyOf"].([]any); ok {
		okAny := false
		for _, sub := range a {
			if validate(doc, sub, root) == nil {
				okAny = true
			}
		}
		if !okAny {
			return fmt.Errorf("%v matches no anyOf branch", doc)
		}
	}
	if a, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, sub := range a {
			if validate(doc, sub, root) == nil {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%v matches %d oneOf branches", doc, n)
		}
	}
	if c, ok := s["const"]; ok && !reflect.DeepEqual(c, doc) {
		return fmt.Errorf("%v is not const %v", doc, c)
	}
	if e, ok := s["enum"].([]any); ok {
		found := false
		for _, v := range e {
			if reflect.DeepEqual(v, doc) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%v not in enum %v", doc, e)
		}
	}
	if t, ok := s["type"]; ok {
		var ts []string
		switch x := t.(type) {
		case string:
			ts = []string{x}
		case []any:
			for _, y := range x {
				ts = append(ts, y.(string))
			}
		}
		jt := jsonType(doc)
		match := false
		for _, want := range ts {
			if want == jt || (want == "number" && jt == "integer") {
				match = true
			}
		}
		if !match {
			return fmt.Errorf("%v has type %s, want %v", doc, jt, ts)
		}
	}
	switch x := doc.(type) {
	case string:
		n := utf8.RuneCountInString(x)
		if v, ok := s["minLength"].(float64); ok && float64(n) < v {
			return fmt.Errorf("%q shorter than %v", x, v)
		}
		if v, ok := s["maxLength"].(float64); ok && float64(n) > v {
			return fmt.Errorf("%q longer than %v", x, v)
		}
	case float64:
		if v, ok := s["minimum"].(float64); ok && x < v {
			return fmt.Errorf("%v below minimum %v", x, v)
		}
		if v, ok := s["maximum"].(float64); ok && x > v {
			return fmt.Errorf("%v above maximum %v", x, v)
		}
		if v, ok := s["exclusiveMinimum"].(float64); ok && x <= v {
			return fmt.Errorf("%v not above exclusiveMinimum %v", x, v)
		}
		if v, ok := s["exclusiveMaximum"].(float64); ok && x >= v {
			return fmt.Errorf("%v not below exclusiveMaximum %v", x, v)
		}
	case []any:
		if v, ok := s["minItems"].(float64); ok && float64(len(x)) < v {
			return fmt.Errorf("%d items, fewer than %v", len(x), v)
		}
		if v, ok := s["maxItems"].(float64); ok && float64(len(x)) > v {
			return fmt.Errorf("%d items, more than %v", len(x), v)
		}
		if it, ok := s["items"]; ok {
			for i, e := range x {
				if err := validate(e, it, root); err != nil {
					return fmt.Errorf("item %d: %w", i, err)
				}
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				if _, ok := x[r.(string)]; !ok {
					return fmt.Errorf("missing required %q", r)
				}
			}
		}
		for k, v := range x {
			if ps, ok := props[k]; ok {
				if err := validate(v, ps, root); err != nil {
					return fmt.Errorf("%q: %w", k, err)
				}
				continue
			}
			switch a := s["additionalProperties"].(type) {
			case bool:
				if !a {
					return fmt.Errorf("additional property %q", k)
				}
			case map[string]any:
				if err := validate(v, a, root); err != nil {
					return fmt.Errorf("%q: %w", k, err)
				}
			}
		}
	}
	return nil
}

// parseAndValidate parses a generated document and validates it.
func parseAndValidate(text string, schema []byte) error {
	var doc any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		return fmt.Errorf("%q does not parse: %v", text, err)
	}
	if schema == nil { // json_object mode
		if _, ok := doc.(map[string]any); !ok {
			return fmt.Errorf("%q is not an object", text)
		}
		return nil
	}
	var s any
	if err := json.Unmarshal(schema, &s); err != nil {
		return err
	}
	if err := validate(doc, s, s); err != nil {
		return fmt.Errorf("%q: %v", text, err)
	}
	return nil
}
