package jinja

import (
	"fmt"
	"math"
	"strings"
	"time"
)

type kwPair struct {
	name string
	v    any
}

// builtin is a global function or filter implementation.
type builtin func(s *state, args []any, kw []kwPair) (any, error)

// boundMethod is obj.name waiting to be called.
type boundMethod struct {
	recv any
	name string
}

type macro struct {
	name     string
	params   []string
	defaults []expr
	body     []node
	closure  *frame
}

type cycler struct {
	items []any
	pos   int
}

type joiner struct {
	sep   string
	first bool
}

var globals = map[string]any{
	"range":           builtin(fnRange),
	"dict":            builtin(fnDict),
	"namespace":       builtin(fnNamespace),
	"raise_exception": builtin(fnRaise),
	"strftime_now":    builtin(fnStrftimeNow),
	"cycler": builtin(func(_ *state, a []any, _ []kwPair) (any, error) {
		if len(a) == 0 {
			return nil, fmt.Errorf("cycler() needs at least one item")
		}
		return &cycler{items: a}, nil
	}),
	"joiner": builtin(func(_ *state, a []any, kw []kwPair) (any, error) {
		sep := ", "
		if v, ok := argOr(a, kw, 0, "sep"); ok {
			sep = toStr(v)
		}
		return &joiner{sep: sep, first: true}, nil
	}),
}

func (s *state) evalArgs(c *callExpr, f *frame) ([]any, []kwPair, error) {
	args := make([]any, 0, len(c.args))
	for _, a := range c.args {
		v, err := s.eval(a, f)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, v)
	}
	if c.starArg != nil {
		v, err := s.eval(c.starArg, f)
		if err != nil {
			return nil, nil, err
		}
		items, err := iterate(v)
		if err != nil {
			return nil, nil, s.errAt(c.pos, "%v", err)
		}
		args = append(args, items...)
	}
	var kw []kwPair
	for _, k := range c.kwargs {
		v, err := s.eval(k.value, f)
		if err != nil {
			return nil, nil, err
		}
		kw = append(kw, kwPair{k.name, v})
	}
	if c.kwStar != nil {
		v, err := s.eval(c.kwStar, f)
		if err != nil {
			return nil, nil, err
		}
		d, ok := v.(*Dict)
		if !ok {
			return nil, nil, s.errAt(c.pos, "argument after ** must be a mapping, not %s", typeName(v))
		}
		for _, k := range d.keys {
			kw = append(kw, kwPair{toStr(k), d.m[k]})
		}
	}
	return args, kw, nil
}

func (s *state) evalCall(c *callExpr, f *frame, caller *macro) (any, error) {
	fn, err := s.eval(c.fn, f)
	if err != nil {
		return nil, err
	}
	args, kw, err := s.evalArgs(c, f)
	if err != nil {
		return nil, err
	}
	v, err := s.call(fn, args, kw, caller)
	return v, s.wrap(c.pos, err)
}

func (s *state) call(fn any, args []any, kw []kwPair, caller *macro) (any, error) {
	switch x := fn.(type) {
	case builtin:
		return x(s, args, kw)
	case boundMethod:
		return s.callMethod(x.recv, x.name, args, kw)
	case *macro:
		return s.callMacro(x, args, kw, caller)
	case *joiner:
		return s.callMethod(x, "__call__", args, kw)
	case *loopInfo:
		if x.rec == nil || len(args) != 1 {
			return nil, fmt.Errorf("loop() needs a recursive for loop and one argument")
		}
		return x.rec(args[0])
	case Undefined:
		if x.Name != "" {
			return nil, fmt.Errorf("'%s' is undefined", x.Name)
		}
		return nil, fmt.Errorf("undefined value is not callable")
	}
	return nil, fmt.Errorf("'%s' object is not callable", typeName(fn))
}

func (s *state) callMacro(m *macro, args []any, kw []kwPair, caller *macro) (any, error) {
	if err := s.step(); err != nil {
		return nil, err
	}
	if s.depth >= maxDepth {
		return nil, fmt.Errorf("macro calls nested deeper than %d", maxDepth)
	}
	s.depth++
	defer func() { s.depth-- }()
	fr := &frame{vars: map[string]any{}, parent: m.closure}
	var varargs []any
	for i, a := range args {
		if i < len(m.params) {
			fr.vars[m.params[i]] = a
		} else {
			varargs = append(varargs, a)
		}
	}
	kwargs := NewDict()
	for _, k := range kw {
		found := false
		for _, p := range m.params {
			if p == k.name {
				fr.vars[p] = k.v
				found = true
				break
			}
		}
		if !found {
			if k.name == "caller" {
				fr.vars["caller"] = k.v
				continue
			}
			kwargs.Set(k.name, k.v)
		}
	}
	for i, p := range m.params {
		if _, ok := fr.vars[p]; ok {
			continue
		}
		if m.defaults[i] != nil {
			v, err := s.eval(m.defaults[i], fr)
			if err != nil {
				return nil, err
			}
			fr.vars[p] = v
		} else {
			fr.vars[p] = Undefined{p}
		}
	}
	fr.vars["varargs"] = &List{Items: varargs, Tuple: true}
	fr.vars["kwargs"] = kwargs
	if caller != nil {
		fr.vars["caller"] = caller
	}
	return s.capture(m.body, fr)
}

// argOr returns positional argument i or keyword name.
func argOr(args []any, kw []kwPair, i int, name string) (any, bool) {
	for _, k := range kw {
		if k.name == name {
			return k.v, true
		}
	}
	if i >= 0 && i < len(args) {
		return args[i], true
	}
	return nil, false
}

func fnRange(s *state, args []any, _ []kwPair) (any, error) {
	var a [3]int64
	for i, v := range args {
		if i > 2 {
			return nil, fmt.Errorf("range expected at most 3 arguments, got %d", len(args))
		}
		n, ok := asInt(v)
		if !ok {
			return nil, fmt.Errorf("range() argument must be int, not %s", typeName(v))
		}
		a[i] = n
	}
	start, stop, step := int64(0), int64(0), int64(1)
	switch len(args) {
	case 1:
		stop = a[0]
	case 2:
		start, stop = a[0], a[1]
	case 3:
		start, stop, step = a[0], a[1], a[2]
	default:
		return nil, fmt.Errorf("range expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return nil, fmt.Errorf("range() arg 3 must not be zero")
	}
	var n int64
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	if n > int64(s.maxSteps) {
		return nil, fmt.Errorf("range of %d items exceeds the template step limit %d", n, s.maxSteps)
	}
	l := &List{Items: make([]any, n)}
	for i := range l.Items {
		l.Items[i] = start + int64(i)*step
	}
	return l, nil
}

func fnDict(_ *state, args []any, kw []kwPair) (any, error) {
	d := NewDict()
	if len(args) > 1 {
		return nil, fmt.Errorf("dict expected at most 1 argument, got %d", len(args))
	}
	if len(args) == 1 {
		switch x := args[0].(type) {
		case *Dict:
			for _, k := range x.keys {
				d.Set(k, x.m[k])
			}
		default:
			items, err := iterate(x)
			if err != nil {
				return nil, err
			}
			for _, it := range items {
				pair, err := iterate(it)
				if err != nil || len(pair) != 2 {
					return nil, fmt.Errorf("dict() sequence elements must be pairs")
				}
				d.Set(pair[0], pair[1])
			}
		}
	}
	for _, k := range kw {
		d.Set(k.name, k.v)
	}
	return d, nil
}

func fnNamespace(s *state, args []any, kw []kwPair) (any, error) {
	d, err := fnDict(s, args, kw)
	if err != nil {
		return nil, err
	}
	return &Namespace{d: d.(*Dict)}, nil
}

func fnRaise(_ *state, args []any, _ []kwPair) (any, error) {
	msg := ""
	if len(args) > 0 {
		msg = toStr(args[0])
	}
	return nil, &RuntimeError{Msg: msg, Raised: true}
}

func fnStrftimeNow(s *state, args []any, _ []kwPair) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("strftime_now() takes exactly one argument")
	}
	now := time.Now()
	if s.t.Now != nil {
		now = s.t.Now()
	}
	return strftime(now, toStr(args[0])), nil
}

// strftime implements the common C/Python directives.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		d := format[i]
		pad := true
		if d == '-' && i+1 < len(format) { // glibc: no padding
			pad = false
			i++
			d = format[i]
		}
		num := func(v, width int) {
			if pad {
				fmt.Fprintf(&b, "%0*d", width, v)
			} else {
				fmt.Fprintf(&b, "%d", v)
			}
		}
		switch d {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'j':
			num(t.YearDay(), 3)
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'Z':
			z, _ := t.Zone()
			b.WriteString(z)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(d)
		}
	}
	return b.String()
}

// ---- operators ----

func (s *state) binop(op string, l, r any) (any, error) {
	if op == "~" {
		out := toStr(l) + toStr(r)
		return out, s.checkSize(len(out))
	}
	if str, ok := l.(string); ok && op == "%" {
		return percentFormat(str, r)
	}
	if _, ok := l.(Undefined); ok {
		return nil, undefinedOperand(l)
	}
	if _, ok := r.(Undefined); ok {
		return nil, undefinedOperand(r)
	}
	li, lInt := asInt(l)
	ri, rInt := asInt(r)
	if isNumber(l) && isNumber(r) {
		if lInt && rInt {
			switch op {
			case "+":
				return li + ri, nil
			case "-":
				return li - ri, nil
			case "*":
				return li * ri, nil
			case "/":
				if ri == 0 {
					return nil, fmt.Errorf("division by zero")
				}
				return float64(li) / float64(ri), nil
			case "//":
				if ri == 0 {
					return nil, fmt.Errorf("integer division or modulo by zero")
				}
				q := li / ri
				if (li%ri != 0) && ((li < 0) != (ri < 0)) {
					q--
				}
				return q, nil
			case "%":
				if ri == 0 {
					return nil, fmt.Errorf("integer division or modulo by zero")
				}
				m := li % ri
				if m != 0 && ((m < 0) != (ri < 0)) {
					m += ri
				}
				return m, nil
			case "**":
				if ri >= 0 {
					res := int64(1)
					base := li
					for e := ri; e > 0; e >>= 1 {
						if e&1 == 1 {
							res *= base
						}
						base *= base
					}
					return res, nil
				}
				if li == 0 {
					return nil, fmt.Errorf("0.0 cannot be raised to a negative power")
				}
				return math.Pow(float64(li), float64(ri)), nil
			}
		}
		a, b := toFloat(l), toFloat(r)
		switch op {
		case "+":
			return a + b, nil
		case "-":
			return a - b, nil
		case "*":
			return a * b, nil
		case "/":
			if b == 0 {
				return nil, fmt.Errorf("float division by zero")
			}
			return a / b, nil
		case "//":
			if b == 0 {
				return nil, fmt.Errorf("float floor division by zero")
			}
			return math.Floor(a / b), nil
		case "%":
			if b == 0 {
				return nil, fmt.Errorf("float modulo")
			}
			m := math.Mod(a, b)
			if m != 0 && ((m < 0) != (b < 0)) {
				m += b
			}
			return m, nil
		case "**":
			if a == 0 && b < 0 {
				return nil, fmt.Errorf("0.0 cannot be raised to a negative power")
			}
			return math.Pow(a, b), nil
		}
	}
	switch op {
	case "+":
		switch x := l.(type) {
		case string:
			if y, ok := r.(string); ok {
				if err := s.checkSize(len(x) + len(y)); err != nil {
					return nil, err
				}
				return x + y, nil
			}
		case *List:
			if y, ok := r.(*List); ok && x.Tuple == y.Tuple {
				if err := s.checkItems(len(x.Items) + len(y.Items)); err != nil {
					return nil, err
				}
				items := make([]any, 0, len(x.Items)+len(y.Items))
				items = append(append(items, x.Items...), y.Items...)
				return &List{Items: items, Tuple: x.Tuple}, nil
			}
		}
	case "*":
		seq, n := l, ri
		if rInt {
			seq, n = l, ri
		} else if lInt {
			seq, n = r, li
		} else {
			break
		}
		if n < 0 {
			n = 0
		}
		switch x := seq.(type) {
		case string:
			if err := s.checkSize(len(x) * int(min(n, int64(s.maxOut)+1))); err != nil {
				return nil, err
			}
			return strings.Repeat(x, int(n)), nil
		case *List:
			if err := s.checkItems(len(x.Items) * int(min(n, int64(s.maxSteps)+1))); err != nil {
				return nil, err
			}
			out := &List{Tuple: x.Tuple}
			for i := int64(0); i < n; i++ {
				out.Items = append(out.Items, x.Items...)
			}
			return out, nil
		}
	case "%":
		if x, ok := l.(string); ok {
			return percentFormat(x, r)
		}
	}
	return nil, fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(r))
}

func undefinedOperand(v any) error {
	if u := v.(Undefined); u.Name != "" {
		return fmt.Errorf("'%s' is undefined", u.Name)
	}
	return fmt.Errorf("operation on an undefined value")
}

// percentFormat is Python's "fmt" % args for %s, %r, %d, %i, %f and %%.
func percentFormat(format string, arg any) (any, error) {
	var args []any
	switch x := arg.(type) {
	case *List:
		if x.Tuple {
			args = x.Items
		} else {
			args = []any{arg}
		}
	case *Dict, Undefined:
		// Python treats objects with __getitem__ as a mapping argument:
		// no error when the format has no conversion specifiers.
		if !strings.Contains(strings.ReplaceAll(format, "%%", ""), "%") {
			return strings.ReplaceAll(format, "%%", "%"), nil
		}
		args = []any{arg}
	default:
		args = []any{arg}
	}
	if l, ok := arg.(*List); ok && !l.Tuple && !strings.Contains(strings.ReplaceAll(format, "%%", ""), "%") {
		return strings.ReplaceAll(format, "%%", "%"), nil
	}
	var b strings.Builder
	ai := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		// optional flags/width/precision
		j := i
		for j < len(format) && strings.IndexByte("-+ 0#.0123456789", format[j]) >= 0 {
			j++
		}
		if j >= len(format) {
			return nil, fmt.Errorf("incomplete format")
		}
		spec := format[i:j]
		verb := format[j]
		for _, num := range strings.FieldsFunc(spec, func(r rune) bool { return r < '0' || r > '9' }) {
			if len(num) > 6 {
				return nil, fmt.Errorf("format width or precision %s too large", num)
			}
		}
		i = j
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if ai >= len(args) {
			return nil, fmt.Errorf("not enough arguments for format string")
		}
		a := args[ai]
		ai++
		switch verb {
		case 's':
			fmt.Fprintf(&b, "%"+spec+"s", toStr(a))
		case 'r':
			fmt.Fprintf(&b, "%"+spec+"s", repr(a))
		case 'd', 'i':
			if !isNumber(a) {
				return nil, fmt.Errorf("%%d format: a number is required, not %s", typeName(a))
			}
			fmt.Fprintf(&b, "%"+spec+"d", int64(toFloat(a)))
		case 'f', 'e', 'g':
			if !isNumber(a) {
				return nil, fmt.Errorf("must be real number, not %s", typeName(a))
			}
			if !strings.Contains(spec, ".") && verb == 'f' {
				spec += ".6"
			}
			fmt.Fprintf(&b, "%"+spec+string(verb), toFloat(a))
		default:
			return nil, fmt.Errorf("unsupported format character '%c'", verb)
		}
	}
	if ai < len(args) {
		return nil, fmt.Errorf("not all arguments converted during string formatting")
	}
	return b.String(), nil
}
