package jinja

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Template is a parsed template; it is safe to Execute concurrently.
type Template struct {
	src  string
	body []node

	// MaxOutput caps the rendered size (and any string or list built on the
	// way) in bytes; MaxSteps caps loop iterations plus macro calls. Both
	// turn runaway templates into errors. Zero means the defaults.
	MaxOutput int
	MaxSteps  int
	// Now is the clock strftime_now reads; nil means time.Now.
	Now func() time.Time
}

const (
	defaultMaxOutput = 16 << 20
	defaultMaxSteps  = 1_000_000
	maxDepth         = 200
)

// Parse compiles a template with Hugging Face's environment settings
// (trim_blocks and lstrip_blocks on, one trailing newline dropped).
func Parse(src string) (*Template, error) {
	src = normalizeSource(src)
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{src: src, toks: toks}
	body, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	return &Template{src: src, body: body}, nil
}

// RuntimeError is an error raised while rendering.
type RuntimeError struct {
	Line, Col int // 0 when unknown
	Msg       string
	// Raised is true for raise_exception() called by the template itself.
	Raised bool
}

func (e *RuntimeError) Error() string {
	if e.Raised {
		return "jinja: template raised: " + e.Msg
	}
	if e.Line > 0 {
		return fmt.Sprintf("jinja: %d:%d: %s", e.Line, e.Col, e.Msg)
	}
	return "jinja: " + e.Msg
}

type frame struct {
	vars   map[string]any
	parent *frame
}

func (f *frame) lookup(name string) (any, bool) {
	for ; f != nil; f = f.parent {
		if v, ok := f.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type state struct {
	t         *Template
	out       *strings.Builder
	steps     int
	depth     int
	maxOut    int
	maxSteps  int
	globals   *frame
	callerFor []*macro // caller() of the innermost call block
}

type loopCtl int

const (
	ctlNone loopCtl = iota
	ctlBreak
	ctlContinue
)

var errLimit = errors.New("limit")

// Execute renders the template. vars are converted with FromGo.
func (t *Template) Execute(vars map[string]any) (string, error) {
	s := &state{t: t, maxOut: t.MaxOutput, maxSteps: t.MaxSteps}
	if s.maxOut <= 0 {
		s.maxOut = defaultMaxOutput
	}
	if s.maxSteps <= 0 {
		s.maxSteps = defaultMaxSteps
	}
	g := &frame{vars: map[string]any{}}
	for k, v := range globals {
		g.vars[k] = v
	}
	for k, v := range vars {
		c, err := FromGo(v)
		if err != nil {
			return "", fmt.Errorf("jinja: variable %q: %w", k, err)
		}
		g.vars[k] = c
	}
	s.globals = g
	var out strings.Builder
	s.out = &out
	top := &frame{vars: map[string]any{}, parent: g}
	if _, err := s.execBody(t.body, top); err != nil {
		return "", err
	}
	return out.String(), nil
}

func (s *state) errAt(pos int, format string, args ...any) error {
	line, col := 0, 0
	if pos >= 0 {
		line, col = lineCol(s.t.src, pos)
	}
	return &RuntimeError{Line: line, Col: col, Msg: fmt.Sprintf(format, args...)}
}

// wrap attaches a position to a bare error from a helper.
func (s *state) wrap(pos int, err error) error {
	if err == nil {
		return nil
	}
	var re *RuntimeError
	if errors.As(err, &re) {
		return err
	}
	return s.errAt(pos, "%s", err.Error())
}

func (s *state) step() error {
	s.steps++
	if s.steps > s.maxSteps {
		return &RuntimeError{Msg: fmt.Sprintf("template exceeded %d loop iterations/macro calls", s.maxSteps)}
	}
	return nil
}

func (s *state) checkSize(n int) error {
	if n > s.maxOut {
		return &RuntimeError{Msg: fmt.Sprintf("template output exceeds %d bytes", s.maxOut)}
	}
	return nil
}

// checkItems bounds list sizes built by the template.
func (s *state) checkItems(n int) error {
	if n > s.maxSteps {
		return &RuntimeError{Msg: fmt.Sprintf("template list exceeds %d items", s.maxSteps)}
	}
	return nil
}

func (s *state) write(str string) error {
	if err := s.checkSize(s.out.Len() + len(str)); err != nil {
		return err
	}
	s.out.WriteString(str)
	return nil
}

func (s *state) execBody(body []node, f *frame) (loopCtl, error) {
	for _, n := range body {
		ctl, err := s.exec(n, f)
		if err != nil || ctl != ctlNone {
			return ctl, err
		}
	}
	return ctlNone, nil
}

func (s *state) exec(n node, f *frame) (loopCtl, error) {
	switch n := n.(type) {
	case *textNode:
		return ctlNone, s.write(n.text)
	case *outputNode:
		v, err := s.eval(n.expr, f)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, s.write(toStr(v))
	case *ifNode:
		for i, c := range n.conds {
			v, err := s.eval(c, f)
			if err != nil {
				return ctlNone, err
			}
			if truthy(v) {
				return s.execBody(n.bodies[i], f)
			}
		}
		return s.execBody(n.els, f)
	case *forNode:
		return ctlNone, s.execFor(n, f)
	case *setNode:
		v, err := s.eval(n.value, f)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, s.assign(n.target, v, f, n.pos)
	case *setBlockNode:
		// Like Jinja, assignments inside the block stay inside it.
		str, err := s.capture(n.body, &frame{vars: map[string]any{}, parent: f})
		if err != nil {
			return ctlNone, err
		}
		var v any = str
		for _, flt := range n.filters {
			if v, err = s.applyFilter(flt, v, f); err != nil {
				return ctlNone, err
			}
		}
		return ctlNone, s.assign(n.target, v, f, 0)
	case *macroNode:
		f.vars[n.name] = &macro{name: n.name, params: n.params, defaults: n.defaults, body: n.body, closure: f}
		return ctlNone, nil
	case *callBlockNode:
		caller := &macro{name: "caller", params: n.params, defaults: n.defaults, body: n.body, closure: f}
		s.callerFor = append(s.callerFor, caller)
		v, err := s.evalCall(n.call, f, caller)
		s.callerFor = s.callerFor[:len(s.callerFor)-1]
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, s.write(toStr(v))
	case *filterBlockNode:
		str, err := s.capture(n.body, &frame{vars: map[string]any{}, parent: f})
		if err != nil {
			return ctlNone, err
		}
		var v any = str
		for _, flt := range n.filters {
			if v, err = s.applyFilter(flt, v, f); err != nil {
				return ctlNone, err
			}
		}
		return ctlNone, s.write(toStr(v))
	case *withNode:
		inner := &frame{vars: map[string]any{}, parent: f}
		for i, t := range n.targets {
			v, err := s.eval(n.values[i], f)
			if err != nil {
				return ctlNone, err
			}
			if err := s.assign(t, v, inner, 0); err != nil {
				return ctlNone, err
			}
		}
		if n.targets == nil { // {% generation %}: no new scope
			inner = f
		}
		return s.execBody(n.body, inner)
	case *doNode:
		_, err := s.eval(n.expr, f)
		return ctlNone, err
	case *breakNode:
		return ctlBreak, nil
	case *continueNode:
		return ctlContinue, nil
	}
	return ctlNone, fmt.Errorf("jinja: internal: unknown node %T", n)
}

// capture renders body into a string (block set, filter blocks, macros).
func (s *state) capture(body []node, f *frame) (string, error) {
	saved := s.out
	var b strings.Builder
	s.out = &b
	_, err := s.execBody(body, f)
	s.out = saved
	if err != nil {
		return "", err
	}
	return b.String(), nil
}

func (s *state) assign(target expr, v any, f *frame, pos int) error {
	switch t := target.(type) {
	case *nameExpr:
		f.vars[t.name] = v
		return nil
	case *attrExpr:
		obj, err := s.eval(t.obj, f)
		if err != nil {
			return err
		}
		ns, ok := obj.(*Namespace)
		if !ok {
			return s.errAt(t.pos, "cannot assign attribute on non-namespace object (%s)", typeName(obj))
		}
		ns.d.Set(t.name, v)
		return nil
	case *tupleExpr:
		items, err := iterate(v)
		if err != nil {
			return s.errAt(pos, "cannot unpack: %v", err)
		}
		if len(items) != len(t.items) {
			return s.errAt(pos, "cannot unpack %d values into %d names", len(items), len(t.items))
		}
		for i, sub := range t.items {
			if err := s.assign(sub, items[i], f, pos); err != nil {
				return err
			}
		}
		return nil
	}
	return s.errAt(pos, "cannot assign to this expression")
}

// loopInfo is the "loop" variable.
type loopInfo struct {
	items   []any
	index0  int
	depth0  int
	changed []any                    // last arguments of loop.changed, nil before the first call
	rec     func(v any) (any, error) // loop(…) in recursive loops
}

func (s *state) execFor(n *forNode, f *frame) error {
	return s.runFor(n, f, nil, 0)
}

func (s *state) runFor(n *forNode, f *frame, iterVal any, depth int) error {
	var err error
	if iterVal == nil {
		if iterVal, err = s.eval(n.iter, f); err != nil {
			return err
		}
	}
	items, err := iterate(iterVal)
	if err != nil {
		return s.errAt(n.pos, "%v", err)
	}
	if n.cond != nil {
		var kept []any
		for _, it := range items {
			if err := s.step(); err != nil {
				return err
			}
			inner := &frame{vars: map[string]any{}, parent: f}
			if err := s.assign(n.target, it, inner, n.pos); err != nil {
				return err
			}
			c, err := s.eval(n.cond, inner)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := s.execBody(n.els, f)
		return err
	}
	li := &loopInfo{items: items, depth0: depth}
	if n.recursive {
		if depth >= maxDepth {
			return s.errAt(n.pos, "recursive loop nested deeper than %d", maxDepth)
		}
		li.rec = func(v any) (any, error) {
			saved := s.out
			var b strings.Builder
			s.out = &b
			err := s.runFor(n, f, v, depth+1)
			s.out = saved
			return b.String(), err
		}
	}
	for i, it := range items {
		if err := s.step(); err != nil {
			return err
		}
		li.index0 = i
		inner := &frame{vars: map[string]any{"loop": li}, parent: f}
		if err := s.assign(n.target, it, inner, n.pos); err != nil {
			return err
		}
		ctl, err := s.execBody(n.body, inner)
		if err != nil {
			return err
		}
		if ctl == ctlBreak {
			break
		}
	}
	return nil
}

// ---- expressions ----

func (s *state) eval(e expr, f *frame) (any, error) {
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		if v, ok := f.lookup(e.name); ok {
			return v, nil
		}
		return Undefined{e.name}, nil
	case *listExpr:
		l := &List{Items: make([]any, len(e.items))}
		for i, x := range e.items {
			v, err := s.eval(x, f)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case *tupleExpr:
		l := &List{Items: make([]any, len(e.items)), Tuple: true}
		for i, x := range e.items {
			v, err := s.eval(x, f)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case *dictExpr:
		d := NewDict()
		for i, k := range e.keys {
			kv, err := s.eval(k, f)
			if err != nil {
				return nil, err
			}
			if !hashable(kv) {
				return nil, fmt.Errorf("jinja: unhashable dict key type '%s'", typeName(kv))
			}
			vv, err := s.eval(e.values[i], f)
			if err != nil {
				return nil, err
			}
			d.Set(kv, vv)
		}
		return d, nil
	case *attrExpr:
		obj, err := s.eval(e.obj, f)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name), nil
	case *itemExpr:
		obj, err := s.eval(e.obj, f)
		if err != nil {
			return nil, err
		}
		key, err := s.eval(e.key, f)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key), nil
	case *sliceExpr:
		return s.evalSlice(e, f)
	case *callExpr:
		return s.evalCall(e, f, nil)
	case *filterExpr:
		v, err := s.eval(e.arg, f)
		if err != nil {
			return nil, err
		}
		return s.applyFilter(e, v, f)
	case *testExpr:
		return s.evalTest(e, f)
	case *unaryExpr:
		x, err := s.eval(e.x, f)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch v := x.(type) {
			case int64:
				return -v, nil
			case float64:
				return -v, nil
			case bool:
				if v {
					return int64(-1), nil
				}
				return int64(0), nil
			}
			return nil, fmt.Errorf("jinja: bad operand type for unary -: '%s'", typeName(x))
		case "+":
			if !isNumber(x) {
				return nil, fmt.Errorf("jinja: bad operand type for unary +: '%s'", typeName(x))
			}
			return x, nil
		}
	case *binExpr:
		switch e.op {
		case "and":
			l, err := s.eval(e.l, f)
			if err != nil || !truthy(l) {
				return l, err
			}
			return s.eval(e.r, f)
		case "or":
			l, err := s.eval(e.l, f)
			if err != nil || truthy(l) {
				return l, err
			}
			return s.eval(e.r, f)
		}
		l, err := s.eval(e.l, f)
		if err != nil {
			return nil, err
		}
		r, err := s.eval(e.r, f)
		if err != nil {
			return nil, err
		}
		v, err := s.binop(e.op, l, r)
		return v, s.wrap(e.pos, err)
	case *compareExpr:
		l, err := s.eval(e.first, f)
		if err != nil {
			return nil, err
		}
		for i, op := range e.ops {
			r, err := s.eval(e.rest[i], f)
			if err != nil {
				return nil, err
			}
			ok, err := compareOp(op, l, r)
			if err != nil {
				return nil, s.wrap(e.pos, err)
			}
			if !ok {
				return false, nil
			}
			l = r
		}
		return true, nil
	case *condExpr:
		c, err := s.eval(e.cond, f)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return s.eval(e.yes, f)
		}
		if e.no == nil {
			return Undefined{}, nil
		}
		return s.eval(e.no, f)
	}
	return nil, fmt.Errorf("jinja: internal: unknown expression %T", e)
}

func hashable(v any) bool {
	switch v.(type) {
	case nil, bool, int64, float64, string:
		return true
	}
	return false
}

func compareOp(op string, l, r any) (bool, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in":
		return contains(r, l)
	case "notin":
		ok, err := contains(r, l)
		return !ok, err
	}
	c, err := compare(l, r)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case ">":
		return c > 0, nil
	case "<=":
		return c <= 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, fmt.Errorf("unknown operator %s", op)
}

func (s *state) evalSlice(e *sliceExpr, f *frame) (any, error) {
	obj, err := s.eval(e.obj, f)
	if err != nil {
		return nil, err
	}
	var idx [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := s.eval(x, f)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := asInt(v)
		if !ok {
			return nil, fmt.Errorf("jinja: slice indices must be integers or None, not %s", typeName(v))
		}
		idx[i] = &n
	}
	return slice(obj, idx[0], idx[1], idx[2])
}

// slice implements Python's seq[start:stop:step].
func slice(obj any, start, stop, step *int64) (any, error) {
	var n int
	var runes []rune
	switch x := obj.(type) {
	case *List:
		n = len(x.Items)
	case string:
		runes = []rune(x)
		n = len(runes)
	case Undefined:
		return Undefined{}, nil
	default:
		return nil, fmt.Errorf("jinja: '%s' object is not subscriptable", typeName(obj))
	}
	st := int64(1)
	if step != nil {
		st = *step
	}
	if st == 0 {
		return nil, fmt.Errorf("jinja: slice step cannot be zero")
	}
	norm := func(p *int64, def int64, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
		}
		if v < lo {
			v = lo
		}
		if v > hi {
			v = hi
		}
		return v
	}
	var idx []int
	if st > 0 {
		a, b := norm(start, 0, 0, int64(n)), norm(stop, int64(n), 0, int64(n))
		for i := a; i < b; i += st {
			idx = append(idx, int(i))
		}
	} else {
		a, b := norm(start, int64(n)-1, -1, int64(n)-1), norm(stop, -1, -1, int64(n)-1)
		if stop != nil && *stop < 0 && *stop+int64(n) < 0 {
			b = -1
		}
		for i := a; i > b; i += st {
			idx = append(idx, int(i))
		}
	}
	switch x := obj.(type) {
	case *List:
		out := &List{Items: make([]any, len(idx)), Tuple: x.Tuple}
		for j, i := range idx {
			out.Items[j] = x.Items[i]
		}
		return out, nil
	default:
		var b strings.Builder
		for _, i := range idx {
			b.WriteRune(runes[i])
		}
		return b.String(), nil
	}
}

// getAttr is Jinja's environment.getattr: attribute first, then item.
func getAttr(obj any, name string) any {
	switch x := obj.(type) {
	case Undefined:
		return Undefined{name}
	case *Dict:
		if m := method(obj, name); m != nil {
			return m
		}
		if v, ok := x.m[name]; ok {
			return v
		}
		return Undefined{name}
	case *Namespace:
		if v, ok := x.d.m[name]; ok {
			return v
		}
		return Undefined{name}
	case *loopInfo:
		return x.attr(name)
	case *cycler:
		switch name {
		case "current":
			return x.items[x.pos]
		case "next", "reset":
			return boundMethod{obj, name}
		}
		return Undefined{name}
	}
	if m := method(obj, name); m != nil {
		return m
	}
	return Undefined{name}
}

// getItem is Jinja's environment.getitem: item first, then attribute.
func getItem(obj any, key any) any {
	switch x := obj.(type) {
	case Undefined:
		return Undefined{}
	case *Dict:
		if v, ok := x.m[normKey(key)]; ok {
			return v
		}
	case *Namespace:
		if v, ok := x.d.m[normKey(key)]; ok {
			return v
		}
	case *List:
		if i, ok := asInt(key); ok {
			if i < 0 {
				i += int64(len(x.Items))
			}
			if i >= 0 && i < int64(len(x.Items)) {
				return x.Items[i]
			}
			return Undefined{}
		}
	case string:
		if i, ok := asInt(key); ok {
			r := []rune(x)
			if i < 0 {
				i += int64(len(r))
			}
			if i >= 0 && i < int64(len(r)) {
				return string(r[i])
			}
			return Undefined{}
		}
	}
	if name, ok := key.(string); ok {
		return getAttr(obj, name)
	}
	return Undefined{}
}

func (l *loopInfo) attr(name string) any {
	n := len(l.items)
	switch name {
	case "index":
		return int64(l.index0 + 1)
	case "index0":
		return int64(l.index0)
	case "revindex":
		return int64(n - l.index0)
	case "revindex0":
		return int64(n - l.index0 - 1)
	case "first":
		return l.index0 == 0
	case "last":
		return l.index0 == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(l.depth0 + 1)
	case "depth0":
		return int64(l.depth0)
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1]
		}
		return Undefined{"previtem"}
	case "nextitem":
		if l.index0+1 < n {
			return l.items[l.index0+1]
		}
		return Undefined{"nextitem"}
	case "cycle", "changed":
		return boundMethod{l, name}
	}
	return Undefined{name}
}
