package jinja

import (
	"fmt"
	"strings"
	"unicode"
)

var strMethods = map[string]bool{
	"strip": true, "lstrip": true, "rstrip": true, "split": true, "rsplit": true, "splitlines": true,
	"startswith": true, "endswith": true, "upper": true, "lower": true, "replace": true,
	"title": true, "capitalize": true, "find": true, "rfind": true, "index": true, "count": true,
	"join": true, "format": true, "isdigit": true, "isalpha": true, "isalnum": true, "isspace": true,
	"isupper": true, "islower": true, "zfill": true, "center": true, "ljust": true, "rjust": true,
	"removeprefix": true, "removesuffix": true, "swapcase": true,
}

var dictMethods = map[string]bool{
	"items": true, "keys": true, "values": true, "get": true, "update": true, "pop": true,
	"copy": true, "setdefault": true,
}

var listMethods = map[string]bool{
	"append": true, "pop": true, "index": true, "count": true, "insert": true, "extend": true,
	"copy": true, "reverse": true, "remove": true, "clear": true,
}

// method returns obj.name as a callable when the type has such a method.
func method(obj any, name string) any {
	ok := false
	switch obj.(type) {
	case string:
		ok = strMethods[name]
	case *Dict:
		ok = dictMethods[name]
	case *List:
		ok = listMethods[name]
	case *joiner:
		ok = name == "__call__"
	}
	if ok {
		return boundMethod{obj, name}
	}
	return nil
}

func nargs(name string, args []any, lo, hi int) error {
	if len(args) < lo || len(args) > hi {
		if lo == hi {
			return fmt.Errorf("%s() takes %d argument(s) (%d given)", name, lo, len(args))
		}
		return fmt.Errorf("%s() takes %d to %d arguments (%d given)", name, lo, hi, len(args))
	}
	return nil
}

func strArg(name string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s() argument must be str, not %s", name, typeName(v))
	}
	return s, nil
}

// pyStrip strips chars (or whitespace when chars is None/absent).
func pyStrip(s string, args []any, left, right bool) (string, error) {
	if len(args) == 0 || args[0] == nil {
		if left {
			s = strings.TrimLeftFunc(s, unicode.IsSpace)
		}
		if right {
			s = strings.TrimRightFunc(s, unicode.IsSpace)
		}
		return s, nil
	}
	cs, err := strArg("strip", args[0])
	if err != nil {
		return "", err
	}
	if left {
		s = strings.TrimLeft(s, cs)
	}
	if right {
		s = strings.TrimRight(s, cs)
	}
	return s, nil
}

// pySplit is str.split(sep=None, maxsplit=-1).
func pySplit(s string, sep any, maxsplit int) ([]any, error) {
	var parts []string
	if sep == nil {
		if maxsplit < 0 {
			parts = strings.Fields(s)
		} else {
			rest := strings.TrimLeftFunc(s, unicode.IsSpace)
			for len(parts) < maxsplit && rest != "" {
				i := strings.IndexFunc(rest, unicode.IsSpace)
				if i < 0 {
					break
				}
				parts = append(parts, rest[:i])
				rest = strings.TrimLeftFunc(rest[i:], unicode.IsSpace)
			}
			if rest != "" {
				parts = append(parts, rest)
			}
		}
	} else {
		sp, err := strArg("split", sep)
		if err != nil {
			return nil, err
		}
		if sp == "" {
			return nil, fmt.Errorf("empty separator")
		}
		parts = strings.SplitN(s, sp, maxsplit+1)
		if maxsplit < 0 {
			parts = strings.Split(s, sp)
		}
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func kwOr(args []any, kw []kwPair, i int, name string, def any) any {
	if v, ok := argOr(args, kw, i, name); ok {
		return v
	}
	return def
}

func (s *state) callMethod(recv any, name string, args []any, kw []kwPair) (any, error) {
	switch x := recv.(type) {
	case string:
		return s.strMethod(x, name, args, kw)
	case *Dict:
		return dictMethod(x, name, args, kw)
	case *List:
		return s.listMethod(x, name, args, kw)
	case *loopInfo:
		switch name {
		case "cycle":
			if len(args) == 0 {
				return nil, fmt.Errorf("no items for cycling given")
			}
			return args[x.index0%len(args)], nil
		case "changed":
			cur := &List{Items: args}
			if x.changed != nil && equal(&List{Items: x.changed}, cur) {
				return false, nil
			}
			x.changed = append([]any{}, args...)
			return true, nil
		}
	case *cycler:
		switch name {
		case "next":
			v := x.items[x.pos]
			x.pos = (x.pos + 1) % len(x.items)
			return v, nil
		case "reset":
			x.pos = 0
			return nil, nil
		}
	case *joiner:
		if x.first {
			x.first = false
			return "", nil
		}
		return x.sep, nil
	}
	return nil, fmt.Errorf("'%s' object has no method '%s'", typeName(recv), name)
}

func (s *state) strMethod(x, name string, args []any, kw []kwPair) (any, error) {
	switch name {
	case "strip":
		return pyStrip(x, args, true, true)
	case "lstrip":
		return pyStrip(x, args, true, false)
	case "rstrip":
		return pyStrip(x, args, false, true)
	case "split", "rsplit":
		sep := kwOr(args, kw, 0, "sep", nil)
		ms, _ := asInt(kwOr(args, kw, 1, "maxsplit", int64(-1)))
		if name == "rsplit" && ms >= 0 {
			// split from the right: reverse, split, reverse
			parts, err := pySplit(reverseStr(x), reverseSep(sep), int(ms))
			if err != nil {
				return nil, err
			}
			for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
				parts[i], parts[j] = parts[j], parts[i]
			}
			for i := range parts {
				parts[i] = reverseStr(parts[i].(string))
			}
			return &List{Items: parts}, nil
		}
		parts, err := pySplit(x, sep, int(ms))
		return &List{Items: parts}, err
	case "splitlines":
		lines := strings.Split(strings.ReplaceAll(x, "\r\n", "\n"), "\n")
		if len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		out := make([]any, len(lines))
		for i, l := range lines {
			out[i] = l
		}
		return &List{Items: out}, nil
	case "startswith", "endswith":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		var cands []any
		if l, ok := args[0].(*List); ok {
			cands = l.Items
		} else {
			cands = []any{args[0]}
		}
		for _, c := range cands {
			p, err := strArg(name, c)
			if err != nil {
				return nil, err
			}
			if name == "startswith" && strings.HasPrefix(x, p) || name == "endswith" && strings.HasSuffix(x, p) {
				return true, nil
			}
		}
		return false, nil
	case "upper":
		return strings.ToUpper(x), nil
	case "lower":
		return strings.ToLower(x), nil
	case "swapcase":
		return strings.Map(func(r rune) rune {
			if unicode.IsUpper(r) {
				return unicode.ToLower(r)
			}
			return unicode.ToUpper(r)
		}, x), nil
	case "title":
		return pyTitle(x), nil
	case "capitalize":
		return pyCapitalize(x), nil
	case "replace":
		if err := nargs(name, args, 2, 3); err != nil {
			return nil, err
		}
		old, err := strArg(name, args[0])
		if err != nil {
			return nil, err
		}
		nw, err := strArg(name, args[1])
		if err != nil {
			return nil, err
		}
		n := int64(-1)
		if len(args) == 3 {
			n, _ = asInt(args[2])
		}
		count := int64(strings.Count(x, old))
		if old == "" {
			count = int64(len([]rune(x))) + 1
		}
		if n >= 0 && n < count {
			count = n
		}
		if err := s.checkSize(len(x) + int(min(count, int64(s.maxOut)))*len(nw)); err != nil {
			return nil, err
		}
		return strings.Replace(x, old, nw, int(n)), nil
	case "find", "rfind", "index":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		sub, err := strArg(name, args[0])
		if err != nil {
			return nil, err
		}
		var i int
		if name == "rfind" {
			i = strings.LastIndex(x, sub)
		} else {
			i = strings.Index(x, sub)
		}
		if i >= 0 {
			i = len([]rune(x[:i]))
		} else if name == "index" {
			return nil, fmt.Errorf("substring not found")
		}
		return int64(i), nil
	case "count":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		sub, err := strArg(name, args[0])
		if err != nil {
			return nil, err
		}
		if sub == "" {
			return int64(len([]rune(x)) + 1), nil
		}
		return int64(strings.Count(x, sub)), nil
	case "join":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		items, err := iterate(args[0])
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, it := range items {
			str, ok := it.(string)
			if !ok {
				return nil, fmt.Errorf("sequence item %d: expected str instance, %s found", i, typeName(it))
			}
			parts[i] = str
		}
		out := strings.Join(parts, x)
		return out, s.checkSize(len(out))
	case "format":
		return pyFormat(x, args, kw)
	case "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower":
		if x == "" {
			return false, nil
		}
		cased := false
		for _, r := range x {
			var ok bool
			switch name {
			case "isdigit":
				ok = unicode.IsDigit(r)
			case "isalpha":
				ok = unicode.IsLetter(r)
			case "isalnum":
				ok = unicode.IsLetter(r) || unicode.IsDigit(r)
			case "isspace":
				ok = unicode.IsSpace(r)
			case "isupper":
				ok = !unicode.IsLower(r)
				cased = cased || unicode.IsUpper(r)
			case "islower":
				ok = !unicode.IsUpper(r)
				cased = cased || unicode.IsLower(r)
			}
			if !ok {
				return false, nil
			}
		}
		if name == "isupper" || name == "islower" {
			return cased, nil
		}
		return true, nil
	case "zfill", "center", "ljust", "rjust":
		if err := nargs(name, args, 1, 2); err != nil {
			return nil, err
		}
		w, ok := asInt(args[0])
		if !ok {
			return nil, fmt.Errorf("%s() width must be int", name)
		}
		if w > int64(s.maxOut) {
			return nil, s.checkSize(int(w))
		}
		fill := " "
		if len(args) == 2 {
			fill = toStr(args[1])
		}
		n := int(w) - len([]rune(x))
		if n <= 0 {
			return x, nil
		}
		switch name {
		case "zfill":
			if strings.HasPrefix(x, "-") || strings.HasPrefix(x, "+") {
				return x[:1] + strings.Repeat("0", n) + x[1:], nil
			}
			return strings.Repeat("0", n) + x, nil
		case "ljust":
			return x + strings.Repeat(fill, n), nil
		case "rjust":
			return strings.Repeat(fill, n) + x, nil
		default:
			left := n / 2
			if n%2 == 1 && int(w)%2 == 1 {
				left++
			}
			return strings.Repeat(fill, left) + x + strings.Repeat(fill, n-left), nil
		}
	case "removeprefix":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		return strings.TrimPrefix(x, toStr(args[0])), nil
	case "removesuffix":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		return strings.TrimSuffix(x, toStr(args[0])), nil
	}
	return nil, fmt.Errorf("'str' object has no attribute '%s'", name)
}

func reverseStr(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

func reverseSep(sep any) any {
	if s, ok := sep.(string); ok {
		return reverseStr(s)
	}
	return sep
}

// pyTitle is str.title: uppercase after any non-letter.
func pyTitle(s string) string {
	var b strings.Builder
	prev := false
	for _, r := range s {
		if unicode.IsLetter(r) {
			if prev {
				b.WriteRune(unicode.ToLower(r))
			} else {
				b.WriteRune(unicode.ToTitle(r))
			}
			prev = true
		} else {
			b.WriteRune(r)
			prev = false
		}
	}
	return b.String()
}

func pyCapitalize(s string) string {
	r := []rune(strings.ToLower(s))
	if len(r) > 0 {
		r[0] = unicode.ToTitle(r[0])
	}
	return string(r)
}

// pyFormat is str.format for {}, {0}, {name} and {name.attr} fields with
// no format spec beyond what toStr gives.
func pyFormat(f string, args []any, kw []kwPair) (any, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c == '{' {
			if i+1 < len(f) && f[i+1] == '{' {
				b.WriteByte('{')
				i++
				continue
			}
			j := strings.IndexByte(f[i:], '}')
			if j < 0 {
				return nil, fmt.Errorf("single '{' encountered in format string")
			}
			field := f[i+1 : i+j]
			i += j
			field, _, _ = strings.Cut(field, ":")
			field, _, _ = strings.Cut(field, "!")
			head, rest, _ := strings.Cut(field, ".")
			var v any
			switch {
			case head == "":
				if auto >= len(args) {
					return nil, fmt.Errorf("replacement index %d out of range", auto)
				}
				v = args[auto]
				auto++
			case head[0] >= '0' && head[0] <= '9':
				var n int
				fmt.Sscanf(head, "%d", &n)
				if n >= len(args) {
					return nil, fmt.Errorf("replacement index %d out of range", n)
				}
				v = args[n]
			default:
				found := false
				for _, k := range kw {
					if k.name == head {
						v, found = k.v, true
					}
				}
				if !found {
					return nil, fmt.Errorf("KeyError: '%s'", head)
				}
			}
			for rest != "" {
				var a string
				a, rest, _ = strings.Cut(rest, ".")
				v = getAttr(v, a)
			}
			b.WriteString(toStr(v))
			continue
		}
		if c == '}' && i+1 < len(f) && f[i+1] == '}' {
			i++
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

func dictMethod(d *Dict, name string, args []any, kw []kwPair) (any, error) {
	switch name {
	case "items":
		out := &List{Items: make([]any, 0, d.Len())}
		for _, k := range d.keys {
			out.Items = append(out.Items, &List{Items: []any{k, d.m[k]}, Tuple: true})
		}
		return out, nil
	case "keys":
		return &List{Items: append([]any(nil), d.keys...)}, nil
	case "values":
		out := &List{Items: make([]any, 0, d.Len())}
		for _, k := range d.keys {
			out.Items = append(out.Items, d.m[k])
		}
		return out, nil
	case "get":
		if err := nargs(name, args, 1, 2); err != nil {
			return nil, err
		}
		if v, ok := d.Get(args[0]); ok {
			return v, nil
		}
		if len(args) == 2 {
			return args[1], nil
		}
		return nil, nil
	case "copy":
		c := NewDict()
		for _, k := range d.keys {
			c.Set(k, d.m[k])
		}
		return c, nil
	case "update":
		for _, a := range args {
			o, ok := a.(*Dict)
			if !ok {
				return nil, fmt.Errorf("update() argument must be a dict")
			}
			for _, k := range o.keys {
				d.Set(k, o.m[k])
			}
		}
		for _, k := range kw {
			d.Set(k.name, k.v)
		}
		return nil, nil
	case "pop":
		if err := nargs(name, args, 1, 2); err != nil {
			return nil, err
		}
		if v, ok := d.Get(args[0]); ok {
			d.delete(args[0])
			return v, nil
		}
		if len(args) == 2 {
			return args[1], nil
		}
		return nil, fmt.Errorf("KeyError: %s", repr(args[0]))
	case "setdefault":
		if err := nargs(name, args, 1, 2); err != nil {
			return nil, err
		}
		if v, ok := d.Get(args[0]); ok {
			return v, nil
		}
		var def any
		if len(args) == 2 {
			def = args[1]
		}
		d.Set(args[0], def)
		return def, nil
	}
	return nil, fmt.Errorf("'dict' object has no attribute '%s'", name)
}

func (s *state) listMethod(l *List, name string, args []any, kw []kwPair) (any, error) {
	switch name {
	case "append":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		if err := s.checkItems(len(l.Items) + 1); err != nil {
			return nil, err
		}
		l.Items = append(l.Items, args[0])
		return nil, nil
	case "extend":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		items, err := iterate(args[0])
		if err != nil {
			return nil, err
		}
		if err := s.checkItems(len(l.Items) + len(items)); err != nil {
			return nil, err
		}
		l.Items = append(l.Items, items...)
		return nil, nil
	case "insert":
		if err := nargs(name, args, 2, 2); err != nil {
			return nil, err
		}
		i, _ := asInt(args[0])
		n := int64(len(l.Items))
		if i < 0 {
			i += n
		}
		i = max(0, min(i, n))
		l.Items = append(l.Items[:i], append([]any{args[1]}, l.Items[i:]...)...)
		return nil, nil
	case "pop":
		if len(l.Items) == 0 {
			return nil, fmt.Errorf("pop from empty list")
		}
		i := int64(len(l.Items) - 1)
		if len(args) > 0 {
			i, _ = asInt(args[0])
			if i < 0 {
				i += int64(len(l.Items))
			}
			if i < 0 || i >= int64(len(l.Items)) {
				return nil, fmt.Errorf("pop index out of range")
			}
		}
		v := l.Items[i]
		l.Items = append(l.Items[:i], l.Items[i+1:]...)
		return v, nil
	case "remove":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		for i, e := range l.Items {
			if equal(e, args[0]) {
				l.Items = append(l.Items[:i], l.Items[i+1:]...)
				return nil, nil
			}
		}
		return nil, fmt.Errorf("list.remove(x): x not in list")
	case "clear":
		l.Items = nil
		return nil, nil
	case "index":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		for i, e := range l.Items {
			if equal(e, args[0]) {
				return int64(i), nil
			}
		}
		return nil, fmt.Errorf("%s is not in list", repr(args[0]))
	case "count":
		if err := nargs(name, args, 1, 1); err != nil {
			return nil, err
		}
		n := 0
		for _, e := range l.Items {
			if equal(e, args[0]) {
				n++
			}
		}
		return int64(n), nil
	case "copy":
		return &List{Items: append([]any(nil), l.Items...), Tuple: l.Tuple}, nil
	case "reverse":
		for i, j := 0, len(l.Items)-1; i < j; i, j = i+1, j-1 {
			l.Items[i], l.Items[j] = l.Items[j], l.Items[i]
		}
		return nil, nil
	}
	return nil, fmt.Errorf("'list' object has no attribute '%s'", name)
}
