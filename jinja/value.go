package jinja

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Values inside the engine are: nil (None), Undefined, bool, int64,
// float64, string, *List, *Dict, *Namespace, *loopInfo, callables
// (*macro, builtin, boundMethod), *cycler, *joiner. Go inputs are converted
// on the way in (see FromGo).

// Undefined is a missing variable or attribute. Like Jinja's default
// Undefined it prints as "", is false, iterates as empty and has length 0;
// unlike it, attribute access on it yields another Undefined (the brief's
// lenient choice, which real chat templates rely on less strictly).
type Undefined struct{ Name string }

// List is a Python list (or tuple when Tuple is set).
type List struct {
	Items []any
	Tuple bool
}

// Dict is an insertion-ordered Python dict. Keys are strings, int64,
// float64, bool or nil.
type Dict struct {
	keys []any
	m    map[any]any
}

// NewDict returns an empty ordered dict.
func NewDict() *Dict { return &Dict{m: map[any]any{}} }

// Set inserts or replaces key (keeping its original position).
func (d *Dict) Set(k, v any) {
	k = normKey(k)
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

// Get returns the value for key.
func (d *Dict) Get(k any) (any, bool) {
	v, ok := d.m[normKey(k)]
	return v, ok
}

// Keys returns the keys in insertion order.
func (d *Dict) Keys() []any { return d.keys }

// Len is the number of entries.
func (d *Dict) Len() int { return len(d.keys) }

func (d *Dict) delete(k any) {
	k = normKey(k)
	if _, ok := d.m[k]; !ok {
		return
	}
	delete(d.m, k)
	for i, x := range d.keys {
		if x == k {
			d.keys = append(d.keys[:i:i], d.keys[i+1:]...)
			break
		}
	}
}

func normKey(k any) any {
	switch x := k.(type) {
	case int:
		return int64(x)
	case float64:
		// Python: 1.0 and 1 are the same key
		if x == math.Trunc(x) && math.Abs(x) < 1<<62 {
			return int64(x)
		}
	}
	return k
}

// Namespace is the mutable object namespace() returns.
type Namespace struct{ d *Dict }

// FromGo converts Go data (maps, slices, structs, json.RawMessage, numbers)
// into template values. map[string]any keys are sorted for determinism;
// pass *Dict or json.RawMessage to keep a specific key order (tojson
// reproduces it, as Python's json.dumps does).
func FromGo(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case Undefined, bool, int64, float64, string, *List, *Dict, *Namespace:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint:
		return int64(x), nil
	case uint64:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case json.Number:
		return numberFromJSON(string(x))
	case json.RawMessage:
		return FromJSON(x)
	case []any:
		l := &List{Items: make([]any, len(x))}
		for i, e := range x {
			c, err := FromGo(e)
			if err != nil {
				return nil, err
			}
			l.Items[i] = c
		}
		return l, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			c, err := FromGo(x[k])
			if err != nil {
				return nil, err
			}
			d.Set(k, c)
		}
		return d, nil
	case builtin, *macro:
		return x, nil
	case func(args ...any) (any, error):
		return builtin(func(_ *state, a []any, _ []kwPair) (any, error) { return x(a...) }), nil
	}
	return fromReflect(reflect.ValueOf(v))
}

func fromReflect(rv reflect.Value) (any, error) {
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil, nil
		}
		return FromGo(rv.Elem().Interface())
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return int64(rv.Uint()), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		l := &List{Items: make([]any, rv.Len())}
		for i := range l.Items {
			c, err := FromGo(rv.Index(i).Interface())
			if err != nil {
				return nil, err
			}
			l.Items[i] = c
		}
		return l, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("jinja: map with %s keys is not supported", rv.Type().Key())
		}
		keys := rv.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		d := NewDict()
		for _, k := range keys {
			c, err := FromGo(rv.MapIndex(k).Interface())
			if err != nil {
				return nil, err
			}
			d.Set(k.String(), c)
		}
		return d, nil
	case reflect.Struct:
		d := NewDict()
		t := rv.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name := f.Name
			omitEmpty := false
			if tag, ok := f.Tag.Lookup("json"); ok {
				parts := strings.Split(tag, ",")
				if parts[0] == "-" {
					continue
				}
				if parts[0] != "" {
					name = parts[0]
				}
				for _, o := range parts[1:] {
					if o == "omitempty" || o == "omitzero" {
						omitEmpty = true
					}
				}
			}
			fv := rv.Field(i)
			if omitEmpty && fv.IsZero() {
				continue
			}
			c, err := FromGo(fv.Interface())
			if err != nil {
				return nil, err
			}
			d.Set(name, c)
		}
		return d, nil
	}
	return nil, fmt.Errorf("jinja: cannot use a Go %s as a template value", rv.Type())
}

// FromJSON decodes JSON keeping object key order (as Python dicts do).
func FromJSON(data []byte) (any, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return nil, fmt.Errorf("jinja: decoding JSON: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("jinja: decoding JSON: trailing data")
	}
	return v, nil
}

func decodeOrdered(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '[':
			l := &List{}
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				l.Items = append(l.Items, v)
			}
			_, err := dec.Token()
			return l, err
		case '{':
			d := NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				d.Set(k, v)
			}
			_, err := dec.Token()
			return d, err
		}
	case json.Number:
		return numberFromJSON(string(x))
	case string, bool, nil:
		return x, nil
	}
	return nil, fmt.Errorf("unexpected token %v", t)
}

func numberFromJSON(s string) (any, error) {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// ---- Python semantics ----

func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "NoneType"
	case Undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case *List:
		if x.Tuple {
			return "tuple"
		}
		return "list"
	case *Dict:
		return "dict"
	case *Namespace:
		return "Namespace"
	case *loopInfo:
		return "LoopContext"
	case *macro:
		return "Macro"
	case builtin, boundMethod:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v any) bool {
	switch x := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case *List:
		return len(x.Items) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// toStr is Python's str() as Jinja prints values.
func toStr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case Undefined:
		return ""
	case string:
		return x
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	}
	return repr(v)
}

// repr is Python's repr() for containers' elements.
func repr(v any) string {
	switch x := v.(type) {
	case string:
		return pyQuote(x)
	case *List:
		var b strings.Builder
		open, close := "[", "]"
		if x.Tuple {
			open, close = "(", ")"
		}
		b.WriteString(open)
		for i, e := range x.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(repr(e))
		}
		if x.Tuple && len(x.Items) == 1 {
			b.WriteString(",")
		}
		b.WriteString(close)
		return b.String()
	case *Dict:
		var b strings.Builder
		b.WriteString("{")
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(repr(k))
			b.WriteString(": ")
			b.WriteString(repr(x.m[k]))
		}
		b.WriteString("}")
		return b.String()
	case *Namespace:
		return "<Namespace " + repr(x.d) + ">"
	case Undefined:
		return "Undefined"
	case *macro:
		return "<Macro '" + x.name + "'>"
	case builtin, boundMethod:
		return "<function>"
	case *loopInfo:
		return "<LoopContext>"
	}
	return toStr(v)
}

func pyQuote(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteByte(q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyFloat formats like Python's float.__repr__: shortest round-trip
// digits, positional notation for exponents in [-4, 16), always a ".0" on
// integral values.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expS, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expS)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := fmt.Sprintf("%+03d", exp)
		return sign + m + "e" + es
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

func isNumber(v any) bool {
	switch v.(type) {
	case int64, float64, bool:
		return true
	}
	return false
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case float64:
		return x
	case bool:
		if x {
			return 1
		}
	}
	return 0
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// equal is Python ==.
func equal(a, b any) bool {
	if isNumber(a) && isNumber(b) {
		ai, aok := asInt(a)
		bi, bok := asInt(b)
		if aok && bok {
			return ai == bi
		}
		return toFloat(a) == toFloat(b)
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case string:
		y, ok := b.(string)
		return ok && x == y
	case *List:
		y, ok := b.(*List)
		if !ok || x.Tuple != y.Tuple || len(x.Items) != len(y.Items) {
			return false
		}
		for i := range x.Items {
			if !equal(x.Items[i], y.Items[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for _, k := range x.keys {
			yv, ok := y.m[k]
			if !ok || !equal(x.m[k], yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

// compare orders numbers, strings and sequences like Python; other pairs
// are an error.
func compare(a, b any) (int, error) {
	if isNumber(a) && isNumber(b) {
		ai, aok := asInt(a)
		bi, bok := asInt(b)
		if aok && bok {
			return cmp3(ai < bi, ai > bi), nil
		}
		fa, fb := toFloat(a), toFloat(b)
		return cmp3(fa < fb, fa > fb), nil
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil
		}
	case *List:
		if y, ok := b.(*List); ok {
			for i := 0; i < len(x.Items) && i < len(y.Items); i++ {
				c, err := compare(x.Items[i], y.Items[i])
				if err != nil || c != 0 {
					return c, err
				}
			}
			return cmp3(len(x.Items) < len(y.Items), len(x.Items) > len(y.Items)), nil
		}
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func cmp3(lt, gt bool) int {
	switch {
	case lt:
		return -1
	case gt:
		return 1
	}
	return 0
}

// iterate returns the items a for loop sees: list items, dict keys, string
// characters; Undefined and None... None is an error like in Python.
func iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case Undefined:
		return nil, nil
	case *List:
		return x.Items, nil
	case *Dict:
		return append([]any(nil), x.keys...), nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case *Namespace:
		return append([]any(nil), x.d.keys...), nil
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

func length(v any) (int, error) {
	switch x := v.(type) {
	case Undefined:
		return 0, nil
	case string:
		return len([]rune(x)), nil
	case *List:
		return len(x.Items), nil
	case *Dict:
		return x.Len(), nil
	}
	return 0, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

func contains(container, item any) (bool, error) {
	switch x := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(x, s), nil
	case *List:
		for _, e := range x.Items {
			if equal(e, item) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		_, ok := x.m[normKey(item)]
		return ok, nil
	case *Namespace:
		_, ok := x.d.m[normKey(item)]
		return ok, nil
	case Undefined:
		return false, nil
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
}
