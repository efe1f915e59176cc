package jinja

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

type filterFn func(s *state, v any, args []any, kw []kwPair) (any, error)

var filters map[string]filterFn

func init() {
	filters = map[string]filterFn{
		"abs":        fAbs,
		"attr":       fAttr,
		"batch":      fBatch,
		"capitalize": strFilter(pyCapitalize),
		"center":     fCenter,
		"count":      fLength,
		"d":          fDefault,
		"default":    fDefault,
		"dictsort":   fDictsort,
		"e":          fEscape,
		"escape":     fEscape,
		"first":      fFirst,
		"float":      fFloat,
		"format":     fFormat,
		"groupby":    fGroupby,
		"indent":     fIndent,
		"int":        fInt,
		"items":      fItems,
		"join":       fJoin,
		"last":       fLast,
		"length":     fLength,
		"list":       fList,
		"lower":      strFilter(strings.ToLower),
		"map":        fMap,
		"max":        fMinMax(true),
		"min":        fMinMax(false),
		"reject":     fSelect(false, false),
		"rejectattr": fSelect(false, true),
		"replace":    fReplace,
		"reverse":    fReverse,
		"round":      fRound,
		"safe":       func(_ *state, v any, _ []any, _ []kwPair) (any, error) { return v, nil },
		"select":     fSelect(true, false),
		"selectattr": fSelect(true, true),
		"sort":       fSort,
		"split":      fSplit,
		"string":     func(_ *state, v any, _ []any, _ []kwPair) (any, error) { return toStr(v), nil },
		"striptags":  fStriptags,
		"sum":        fSum,
		"title":      strFilter(pyTitle),
		"tojson":     fToJSON,
		"trim":       fTrim,
		"truncate":   fTruncate,
		"unique":     fUnique,
		"upper":      strFilter(strings.ToUpper),
		"wordcount":  fWordcount,
	}
}

func (s *state) applyFilter(fe *filterExpr, v any, f *frame) (any, error) {
	fn, ok := filters[fe.name]
	if !ok {
		return nil, s.errAt(fe.pos, "no filter named '%s'", fe.name)
	}
	args := make([]any, 0, len(fe.args))
	for _, a := range fe.args {
		x, err := s.eval(a, f)
		if err != nil {
			return nil, err
		}
		args = append(args, x)
	}
	var kw []kwPair
	for _, k := range fe.kwargs {
		x, err := s.eval(k.value, f)
		if err != nil {
			return nil, err
		}
		kw = append(kw, kwPair{k.name, x})
	}
	out, err := fn(s, v, args, kw)
	if err != nil {
		var re *RuntimeError
		if !asRuntime(err, &re) {
			return nil, s.errAt(fe.pos, "filter %s: %v", fe.name, err)
		}
	}
	return out, err
}

func asRuntime(err error, re **RuntimeError) bool {
	r, ok := err.(*RuntimeError)
	if ok {
		*re = r
	}
	return ok
}

func strFilter(fn func(string) string) filterFn {
	return func(_ *state, v any, _ []any, _ []kwPair) (any, error) { return fn(toStr(v)), nil }
}

func fAbs(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case float64:
		return math.Abs(x), nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	}
	return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
}

func fAttr(_ *state, v any, args []any, _ []kwPair) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("attr needs one argument")
	}
	return getAttr(v, toStr(args[0])), nil
}

func fBatch(s *state, v any, args []any, kw []kwPair) (any, error) {
	n, ok := asInt(kwOr(args, kw, 0, "linecount", nil))
	if !ok || n <= 0 {
		return nil, fmt.Errorf("batch needs a positive line count")
	}
	if n > int64(s.maxSteps) {
		return nil, fmt.Errorf("batch size %d exceeds the template step limit", n)
	}
	fill, hasFill := argOr(args, kw, 1, "fill_with")
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := &List{}
	for i := 0; i < len(items); i += int(n) {
		end := min(i+int(n), len(items))
		row := &List{Items: append([]any(nil), items[i:end]...)}
		for hasFill && len(row.Items) < int(n) {
			row.Items = append(row.Items, fill)
		}
		out.Items = append(out.Items, row)
	}
	return out, nil
}

func fCenter(s *state, v any, args []any, kw []kwPair) (any, error) {
	w := kwOr(args, kw, 0, "width", int64(80))
	return s.strMethod(toStr(v), "center", []any{w}, nil)
}

func fLength(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	n, err := length(v)
	return int64(n), err
}

func fDefault(_ *state, v any, args []any, kw []kwPair) (any, error) {
	def := kwOr(args, kw, 0, "default_value", "")
	boolean := truthy(kwOr(args, kw, 1, "boolean", false))
	if _, undef := v.(Undefined); undef || (boolean && !truthy(v)) {
		return def, nil
	}
	return v, nil
}

func fDictsort(_ *state, v any, args []any, kw []kwPair) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, fmt.Errorf("dictsort expects a dict, got %s", typeName(v))
	}
	cs := truthy(kwOr(args, kw, 0, "case_sensitive", false))
	by := toStr(kwOr(args, kw, 1, "by", "key"))
	rev := truthy(kwOr(args, kw, 2, "reverse", false))
	pos := 0
	if by == "value" {
		pos = 1
	} else if by != "key" {
		return nil, fmt.Errorf("you can only sort by either 'key' or 'value'")
	}
	items := make([]any, 0, d.Len())
	for _, k := range d.keys {
		items = append(items, &List{Items: []any{k, d.m[k]}, Tuple: true})
	}
	var err error
	slices.SortStableFunc(items, func(a, b any) int {
		x, y := a.(*List).Items[pos], b.(*List).Items[pos]
		c, e := compare(sortKey(x, cs), sortKey(y, cs))
		if e != nil {
			err = e
		}
		if rev {
			return -c
		}
		return c
	})
	return &List{Items: items}, err
}

func sortKey(v any, caseSensitive bool) any {
	if s, ok := v.(string); ok && !caseSensitive {
		return strings.ToLower(s)
	}
	return v
}

func fEscape(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	// markupsafe escapes exactly these five
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")
	return r.Replace(toStr(v)), nil
}

func fFirst(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return Undefined{}, nil
	}
	return items[0], nil
}

func fLast(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return Undefined{}, nil
	}
	return items[len(items)-1], nil
}

func fFloat(_ *state, v any, args []any, kw []kwPair) (any, error) {
	def := kwOr(args, kw, 0, "default", 0.0)
	switch x := v.(type) {
	case float64:
		return x, nil
	case int64, bool:
		return toFloat(x), nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		if err != nil {
			return def, nil
		}
		return f, nil
	}
	return def, nil
}

func fInt(_ *state, v any, args []any, kw []kwPair) (any, error) {
	def := kwOr(args, kw, 0, "default", int64(0))
	base, _ := asInt(kwOr(args, kw, 1, "base", int64(10)))
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		i, _ := asInt(x)
		return i, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return def, nil
		}
		return int64(x), nil
	case string:
		t := strings.ReplaceAll(strings.TrimSpace(x), "_", "")
		if i, err := strconv.ParseInt(t, int(base), 64); err == nil {
			return i, nil
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return int64(f), nil
		}
	}
	return def, nil
}

func fFormat(_ *state, v any, args []any, _ []kwPair) (any, error) {
	var arg any = &List{Items: args, Tuple: true}
	return percentFormat(toStr(v), arg)
}

func fGroupby(_ *state, v any, args []any, kw []kwPair) (any, error) {
	attr, ok := argOr(args, kw, 0, "attribute")
	if !ok {
		return nil, fmt.Errorf("groupby needs an attribute")
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	key := func(it any) any { return lookupPath(it, attr) }
	sorted := append([]any(nil), items...)
	slices.SortStableFunc(sorted, func(a, b any) int {
		c, e := compare(key(a), key(b))
		if e != nil {
			err = e
		}
		return c
	})
	out := &List{}
	for _, it := range sorted {
		k := key(it)
		n := len(out.Items)
		if n > 0 && equal(out.Items[n-1].(*List).Items[0], k) {
			g := out.Items[n-1].(*List).Items[1].(*List)
			g.Items = append(g.Items, it)
			continue
		}
		out.Items = append(out.Items, &List{Items: []any{k, &List{Items: []any{it}}}, Tuple: true})
	}
	return out, err
}

// lookupPath follows "a.b.0" style attribute paths (Jinja's make_attrgetter).
func lookupPath(v any, attr any) any {
	if s, ok := attr.(string); ok {
		for _, part := range strings.Split(s, ".") {
			if n, err := strconv.ParseInt(part, 10, 64); err == nil {
				v = getItem(v, n)
			} else {
				v = getItem(v, part)
			}
		}
		return v
	}
	return getItem(v, attr)
}

func fIndent(st *state, v any, args []any, kw []kwPair) (any, error) {
	width := kwOr(args, kw, 0, "width", int64(4))
	first := truthy(kwOr(args, kw, 1, "first", false))
	blank := truthy(kwOr(args, kw, 2, "blank", false))
	var ind string
	if w, ok := asInt(width); ok {
		ind = strings.Repeat(" ", int(max(0, min(w, 1<<16))))
	} else {
		ind = toStr(width)
	}
	str := toStr(v)
	lines := strings.Split(str, "\n")
	if err := st.checkSize(len(str) + len(lines)*len(ind)); err != nil {
		return nil, err
	}
	for i, l := range lines {
		if i == 0 && !first {
			continue
		}
		if l == "" && !blank {
			continue
		}
		lines[i] = ind + l
	}
	return strings.Join(lines, "\n"), nil
}

func fItems(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	switch x := v.(type) {
	case Undefined:
		return &List{}, nil
	case *Dict:
		return dictMethod(x, "items", nil, nil)
	}
	return nil, fmt.Errorf("can only get item pairs from a mapping, not %s", typeName(v))
}

func fJoin(s *state, v any, args []any, kw []kwPair) (any, error) {
	sep := toStr(kwOr(args, kw, 0, "d", ""))
	attr, hasAttr := argOr(args, kw, 1, "attribute")
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(items))
	total := 0
	for i, it := range items {
		if hasAttr {
			it = lookupPath(it, attr)
		}
		parts[i] = toStr(it)
		total += len(parts[i]) + len(sep)
	}
	if err := s.checkSize(total); err != nil {
		return nil, err
	}
	return strings.Join(parts, sep), nil
}

func fList(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	return &List{Items: append([]any(nil), items...)}, nil
}

func fMap(s *state, v any, args []any, kw []kwPair) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := &List{Items: make([]any, 0, len(items))}
	if attr, ok := argOr(nil, kw, -1, "attribute"); ok {
		def, hasDef := argOr(nil, kw, -1, "default")
		for _, it := range items {
			x := lookupPath(it, attr)
			if _, undef := x.(Undefined); undef && hasDef {
				x = def
			}
			out.Items = append(out.Items, x)
		}
		return out, nil
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("map needs a filter name or attribute=")
	}
	name := toStr(args[0])
	fn, ok := filters[name]
	if !ok {
		return nil, fmt.Errorf("no filter named '%s'", name)
	}
	for _, it := range items {
		x, err := fn(s, it, args[1:], kw)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, x)
	}
	return out, nil
}

func fMinMax(isMax bool) filterFn {
	return func(_ *state, v any, args []any, kw []kwPair) (any, error) {
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		cs := truthy(kwOr(args, kw, 0, "case_sensitive", false))
		attr, hasAttr := argOr(args, kw, 1, "attribute")
		if len(items) == 0 {
			return Undefined{}, nil
		}
		key := func(x any) any {
			if hasAttr {
				x = lookupPath(x, attr)
			}
			return sortKey(x, cs)
		}
		best := items[0]
		for _, it := range items[1:] {
			c, err := compare(key(it), key(best))
			if err != nil {
				return nil, err
			}
			if (isMax && c > 0) || (!isMax && c < 0) {
				best = it
			}
		}
		return best, nil
	}
}

func fSelect(keep, byAttr bool) filterFn {
	return func(s *state, v any, args []any, kw []kwPair) (any, error) {
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		var attr any
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("missing attribute")
			}
			attr, args = args[0], args[1:]
		}
		test := ""
		if len(args) > 0 {
			test, args = toStr(args[0]), args[1:]
		}
		out := &List{}
		for _, it := range items {
			x := it
			if byAttr {
				x = lookupPath(it, attr)
			}
			var ok bool
			if test == "" {
				ok = truthy(x)
			} else {
				ok, err = s.runTest(test, x, args)
				if err != nil {
					return nil, err
				}
			}
			if ok == keep {
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	}
}

func fReplace(s *state, v any, args []any, kw []kwPair) (any, error) {
	if len(args) < 2 {
		return nil, fmt.Errorf("replace needs old and new")
	}
	a := []any{toStr(args[0]), toStr(args[1])}
	if c, ok := argOr(args, kw, 2, "count"); ok && c != nil {
		a = append(a, c)
	}
	return s.strMethod(toStr(v), "replace", a, nil)
}

func fReverse(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	if str, ok := v.(string); ok {
		return reverseStr(str), nil
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := &List{Items: make([]any, len(items))}
	for i, it := range items {
		out.Items[len(items)-1-i] = it
	}
	return out, nil
}

func fRound(_ *state, v any, args []any, kw []kwPair) (any, error) {
	prec, _ := asInt(kwOr(args, kw, 0, "precision", int64(0)))
	method := toStr(kwOr(args, kw, 1, "method", "common"))
	if !isNumber(v) {
		return nil, fmt.Errorf("round expects a number, got %s", typeName(v))
	}
	x := toFloat(v)
	p := math.Pow(10, float64(prec))
	switch method {
	case "common":
		if i, ok := asInt(v); ok && prec >= 0 {
			return i, nil // Python's round(int, n) stays an int
		}
		// Python's round() on the scaled value: half to even is what
		// Jinja's "common" ends up using through round().
		return math.RoundToEven(x*p) / p, nil
	case "ceil":
		return math.Ceil(x*p) / p, nil
	case "floor":
		return math.Floor(x*p) / p, nil
	}
	return nil, fmt.Errorf("method must be common, ceil or floor")
}

func fSort(_ *state, v any, args []any, kw []kwPair) (any, error) {
	rev := truthy(kwOr(args, kw, 0, "reverse", false))
	cs := truthy(kwOr(args, kw, 1, "case_sensitive", false))
	attr, hasAttr := argOr(args, kw, 2, "attribute")
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := append([]any(nil), items...)
	slices.SortStableFunc(out, func(a, b any) int {
		if hasAttr {
			a, b = lookupPath(a, attr), lookupPath(b, attr)
		}
		c, e := compare(sortKey(a, cs), sortKey(b, cs))
		if e != nil {
			err = e
		}
		if rev {
			return -c
		}
		return c
	})
	return &List{Items: out}, err
}

func fSplit(s *state, v any, args []any, kw []kwPair) (any, error) {
	sep := kwOr(args, kw, 0, "sep", nil)
	ms := kwOr(args, kw, 1, "maxsplit", int64(-1))
	return s.strMethod(toStr(v), "split", []any{sep, ms}, nil)
}

func fStriptags(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	str := toStr(v)
	var b strings.Builder
	in := false
	for _, r := range str {
		switch {
		case r == '<':
			in = true
		case r == '>' && in:
			in = false
		case !in:
			b.WriteRune(r)
		}
	}
	return strings.Join(strings.Fields(html.UnescapeString(b.String())), " "), nil
}

func fSum(s *state, v any, args []any, kw []kwPair) (any, error) {
	attr, hasAttr := argOr(args, kw, 0, "attribute")
	var total any = kwOr(args, kw, 1, "start", int64(0))
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		if hasAttr {
			it = lookupPath(it, attr)
		}
		if total, err = s.binop("+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func fTrim(_ *state, v any, args []any, kw []kwPair) (any, error) {
	chars := kwOr(args, kw, 0, "chars", nil)
	return pyStrip(toStr(v), []any{chars}, true, true)
}

func fTruncate(_ *state, v any, args []any, kw []kwPair) (any, error) {
	str := toStr(v)
	n, _ := asInt(kwOr(args, kw, 0, "length", int64(255)))
	killwords := truthy(kwOr(args, kw, 1, "killwords", false))
	end := toStr(kwOr(args, kw, 2, "end", "..."))
	leeway, _ := asInt(kwOr(args, kw, 3, "leeway", int64(5)))
	r := []rune(str)
	if int64(len(r)) <= n+leeway {
		return str, nil
	}
	cut := max(0, int(n)-len([]rune(end)))
	if killwords {
		return string(r[:cut]) + end, nil
	}
	head := string(r[:cut])
	if i := strings.LastIndex(head, " "); i >= 0 {
		head = head[:i]
	}
	return head + end, nil
}

func fUnique(_ *state, v any, args []any, kw []kwPair) (any, error) {
	cs := truthy(kwOr(args, kw, 0, "case_sensitive", false))
	attr, hasAttr := argOr(args, kw, 1, "attribute")
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := &List{}
	var seen []any
	for _, it := range items {
		k := it
		if hasAttr {
			k = lookupPath(it, attr)
		}
		k = sortKey(k, cs)
		dup := false
		for _, s := range seen {
			if equal(s, k) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out.Items = append(out.Items, it)
		}
	}
	return out, nil
}

func fWordcount(_ *state, v any, _ []any, _ []kwPair) (any, error) {
	n := 0
	in := false
	for _, r := range toStr(v) {
		w := unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_'
		if w && !in {
			n++
		}
		in = w
	}
	return int64(n), nil
}

func fToJSON(s *state, v any, args []any, kw []kwPair) (any, error) {
	var o jsonOpts
	if ind, ok := argOr(args, kw, 0, "indent"); ok && ind != nil {
		switch x := ind.(type) {
		case string:
			o.indent, o.hasIndent = x, true
		default:
			n, ok := asInt(ind)
			if !ok {
				return nil, fmt.Errorf("tojson indent must be an int or string")
			}
			o.indent, o.hasIndent = strings.Repeat(" ", int(max(0, min(n, 64)))), true
		}
	}
	o.itemSep, o.keySep = ", ", ": "
	if o.hasIndent {
		o.itemSep = ","
	}
	if sep, ok := argOr(args, kw, 1, "separators"); ok && sep != nil {
		items, err := iterate(sep)
		if err != nil || len(items) != 2 {
			return nil, fmt.Errorf("tojson separators must be a pair of strings")
		}
		o.itemSep, o.keySep = toStr(items[0]), toStr(items[1])
	}
	o.sortKeys = truthy(kwOr(args, kw, 2, "sort_keys", false))
	o.ensureASCII = truthy(kwOr(nil, kw, -1, "ensure_ascii", false))
	var b strings.Builder
	if err := writeJSON(&b, v, o, 0, s.maxOut); err != nil {
		return nil, err
	}
	return b.String(), nil
}
