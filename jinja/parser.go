package jinja

import (
	"fmt"
	"strconv"
)

// ---- AST ----

type node interface{}

type textNode struct{ text string }
type outputNode struct {
	expr expr
	pos  int
}
type ifNode struct {
	conds  []expr
	bodies [][]node
	els    []node
}
type forNode struct {
	target    expr // nameExpr or tupleExpr of names
	iter      expr
	cond      expr
	body, els []node
	recursive bool
	pos       int
}
type setNode struct {
	target expr // nameExpr, attrExpr (ns.x) or tupleExpr
	value  expr
	pos    int
}
type setBlockNode struct {
	target  expr
	filters []*filterExpr // applied to the captured body; arg is nil
	body    []node
}
type macroNode struct {
	name     string
	params   []string
	defaults []expr // aligned with params; nil = required
	body     []node
}
type callBlockNode struct {
	call     *callExpr
	params   []string
	defaults []expr
	body     []node
	pos      int
}
type filterBlockNode struct {
	filters []*filterExpr
	body    []node
}
type withNode struct {
	targets []expr
	values  []expr
	body    []node
}
type doNode struct {
	expr expr
	pos  int
}
type breakNode struct{}
type continueNode struct{}

type expr interface{}

type constExpr struct{ v any }
type nameExpr struct {
	name string
	pos  int
}
type listExpr struct{ items []expr }
type tupleExpr struct{ items []expr }
type dictExpr struct{ keys, values []expr }
type attrExpr struct {
	obj  expr
	name string
	pos  int
}
type itemExpr struct {
	obj, key expr
	pos      int
}
type sliceExpr struct {
	obj               expr
	start, stop, step expr // nil when omitted
}
type kwArg struct {
	name  string
	value expr
}
type callExpr struct {
	fn      expr
	args    []expr
	kwargs  []kwArg
	starArg expr
	kwStar  expr
	pos     int
}
type filterExpr struct {
	arg    expr // nil inside filter blocks
	name   string
	args   []expr
	kwargs []kwArg
	pos    int
}
type testExpr struct {
	arg    expr
	name   string
	args   []expr
	negate bool
	pos    int
}
type unaryExpr struct {
	op string // "-", "+", "not"
	x  expr
}
type binExpr struct {
	op   string
	l, r expr
	pos  int
}
type compareExpr struct {
	first expr
	ops   []string
	rest  []expr
	pos   int
}
type condExpr struct {
	cond, yes, no expr // no may be nil (undefined)
}

// ---- parser ----

type parser struct {
	src   string
	toks  []token
	i     int
	depth int
}

// maxNesting bounds parser recursion so hostile input cannot exhaust the
// goroutine stack (a fatal error, not a recoverable panic).
const maxNesting = 256

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxNesting {
		return p.errAt(p.peek().pos, "nesting deeper than %d", maxNesting)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

func (p *parser) peek() token { return p.toks[p.i] }
func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) errAt(pos int, format string, args ...any) error {
	line, col := lineCol(p.src, pos)
	return &SyntaxError{line, col, fmt.Sprintf(format, args...)}
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of template"
	case tVarEnd:
		return "'}}'"
	case tBlockEnd:
		return "'%}'"
	case tVarBegin:
		return "'{{'"
	case tBlockBegin:
		return "'{%'"
	case tData:
		return "template text"
	case tString:
		return "string " + strconv.Quote(t.val)
	}
	return strconv.Quote(t.val)
}

func (p *parser) isOp(v string) bool {
	t := p.peek()
	return t.kind == tOp && t.val == v
}
func (p *parser) isName(v string) bool {
	t := p.peek()
	return t.kind == tName && t.val == v
}

func (p *parser) expectOp(v string) error {
	t := p.next()
	if t.kind != tOp || t.val != v {
		return p.errAt(t.pos, "expected %q, got %s", v, describe(t))
	}
	return nil
}

func (p *parser) expectName() (token, error) {
	t := p.next()
	if t.kind != tName {
		return t, p.errAt(t.pos, "expected a name, got %s", describe(t))
	}
	return t, nil
}

func (p *parser) expectBlockEnd() error {
	t := p.next()
	if t.kind != tBlockEnd {
		return p.errAt(t.pos, "expected '%%}', got %s", describe(t))
	}
	return nil
}

// parseBody parses nodes until a block tag whose name is in ends; it
// returns the body and the end tag's name (the tag name token consumed, the
// rest of the tag not).
func (p *parser) parseBody(ends ...string) ([]node, string, error) {
	var body []node
	for {
		t := p.peek()
		switch t.kind {
		case tEOF:
			if len(ends) > 0 {
				return nil, "", p.errAt(t.pos, "unexpected end of template, expected one of %v", ends)
			}
			return body, "", nil
		case tData:
			p.next()
			body = append(body, &textNode{t.val})
		case tVarBegin:
			p.next()
			e, err := p.parseExpr()
			if err != nil {
				return nil, "", err
			}
			if end := p.next(); end.kind != tVarEnd {
				return nil, "", p.errAt(end.pos, "expected '}}', got %s", describe(end))
			}
			body = append(body, &outputNode{e, t.pos})
		case tBlockBegin:
			p.next()
			name := p.peek()
			if name.kind != tName {
				return nil, "", p.errAt(name.pos, "expected a tag name, got %s", describe(name))
			}
			for _, e := range ends {
				if name.val == e {
					p.next()
					return body, e, nil
				}
			}
			n, err := p.parseStatement()
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				body = append(body, n)
			}
		default:
			return nil, "", p.errAt(t.pos, "unexpected %s", describe(t))
		}
	}
}

func (p *parser) parseStatement() (node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	t := p.next()
	switch t.val {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor(t.pos)
	case "set":
		return p.parseSet(t.pos)
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock(t.pos)
	case "filter":
		return p.parseFilterBlock()
	case "with":
		return p.parseWith()
	case "do":
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		return &doNode{e, t.pos}, p.expectBlockEnd()
	case "break":
		return &breakNode{}, p.expectBlockEnd()
	case "continue":
		return &continueNode{}, p.expectBlockEnd()
	case "generation":
		// transformers' AssistantTracker tag: rendering is unaffected.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody("endgeneration")
		if err != nil {
			return nil, err
		}
		return &withNode{body: body}, p.expectBlockEnd()
	case "include", "import", "from", "extends", "block":
		return nil, p.errAt(t.pos, "tag %q is not supported (templates are self-contained)", t.val)
	}
	return nil, p.errAt(t.pos, "unknown tag %q", t.val)
}

func (p *parser) parseIf() (node, error) {
	n := &ifNode{}
	cond, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	for {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody("elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			if cond, err = p.parseExpr(); err != nil {
				return nil, err
			}
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if n.els, _, err = p.parseBody("endif"); err != nil {
				return nil, err
			}
		}
		return n, p.expectBlockEnd()
	}
}

// parseAssignTarget parses a name, a tuple of names, or (for set) ns.attr.
func (p *parser) parseAssignTarget(allowAttr bool) (expr, error) {
	var items []expr
	paren := false
	if p.isOp("(") {
		p.next()
		paren = true
	}
	for {
		t, err := p.expectName()
		if err != nil {
			return nil, err
		}
		var e expr = &nameExpr{t.val, t.pos}
		if allowAttr && p.isOp(".") {
			p.next()
			a, err := p.expectName()
			if err != nil {
				return nil, err
			}
			e = &attrExpr{e, a.val, a.pos}
		}
		items = append(items, e)
		if !p.isOp(",") {
			break
		}
		p.next()
		if paren && p.isOp(")") {
			break
		}
		if !paren && p.peek().kind != tName {
			break
		}
	}
	if paren {
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
	}
	if len(items) == 1 && !paren {
		return items[0], nil
	}
	return &tupleExpr{items}, nil
}

func (p *parser) parseFor(pos int) (node, error) {
	n := &forNode{pos: pos}
	var err error
	if n.target, err = p.parseAssignTarget(false); err != nil {
		return nil, err
	}
	if t := p.next(); t.kind != tName || t.val != "in" {
		return nil, p.errAt(t.pos, "expected 'in', got %s", describe(t))
	}
	// no conditional expression here: "if" starts the loop filter
	if n.iter, err = p.parseOr(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		if n.cond, err = p.parseOr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		p.next()
		n.recursive = true
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody("else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.parseBody("endfor"); err != nil {
			return nil, err
		}
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseSet(pos int) (node, error) {
	target, err := p.parseAssignTarget(true)
	if err != nil {
		return nil, err
	}
	if p.isOp("=") {
		p.next()
		v, err := p.parseTupleExpr()
		if err != nil {
			return nil, err
		}
		return &setNode{target, v, pos}, p.expectBlockEnd()
	}
	n := &setBlockNode{target: target}
	for p.isOp("|") {
		p.next()
		f, err := p.parseFilterCall(nil)
		if err != nil {
			return nil, err
		}
		n.filters = append(n.filters, f)
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endset"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseParams() ([]string, []expr, error) {
	var names []string
	var defs []expr
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	for !p.isOp(")") {
		if len(names) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, err
			}
			if p.isOp(")") {
				break
			}
		}
		t, err := p.expectName()
		if err != nil {
			return nil, nil, err
		}
		var d expr
		if p.isOp("=") {
			p.next()
			if d, err = p.parseExpr(); err != nil {
				return nil, nil, err
			}
		}
		names = append(names, t.val)
		defs = append(defs, d)
	}
	p.next()
	return names, defs, nil
}

func (p *parser) parseMacro() (node, error) {
	t, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &macroNode{name: t.val}
	if n.params, n.defaults, err = p.parseParams(); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endmacro"); err != nil {
		return nil, err
	}
	if p.peek().kind == tName && p.peek().val == n.name {
		p.next()
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseCallBlock(pos int) (node, error) {
	n := &callBlockNode{pos: pos}
	var err error
	if p.isOp("(") {
		if n.params, n.defaults, err = p.parseParams(); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	c, ok := e.(*callExpr)
	if !ok {
		return nil, p.errAt(pos, "call block needs a macro call")
	}
	n.call = c
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endcall"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseFilterBlock() (node, error) {
	n := &filterBlockNode{}
	for {
		f, err := p.parseFilterCall(nil)
		if err != nil {
			return nil, err
		}
		n.filters = append(n.filters, f)
		if !p.isOp("|") {
			break
		}
		p.next()
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	var err error
	if n.body, _, err = p.parseBody("endfilter"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseWith() (node, error) {
	n := &withNode{}
	for p.peek().kind != tBlockEnd {
		if len(n.targets) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		t, err := p.parseAssignTarget(false)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		v, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, t)
		n.values = append(n.values, v)
	}
	p.next()
	var err error
	if n.body, _, err = p.parseBody("endwith"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

// ---- expressions ----

// parseTupleExpr allows an unparenthesized tuple ("set a = 1, 2").
func (p *parser) parseTupleExpr() (expr, error) {
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return e, nil
	}
	items := []expr{e}
	for p.isOp(",") {
		p.next()
		if t := p.peek(); t.kind == tBlockEnd || t.kind == tVarEnd {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleExpr{items}, nil
}

func (p *parser) parseExpr() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var no expr
		if p.isName("else") {
			p.next()
			if no, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = &condExpr{cond, e, no}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isName("or") {
		t := p.next()
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &binExpr{"or", l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isName("and") {
		t := p.next()
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &binExpr{"and", l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.next()
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{"not", x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	pos := p.peek().pos
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []expr
	for {
		t := p.peek()
		op := ""
		switch {
		case t.kind == tOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
			op = t.val
			p.next()
		case t.kind == tName && t.val == "in":
			op = "in"
			p.next()
		case t.kind == tName && t.val == "not" && p.toks[p.i+1].kind == tName && p.toks[p.i+1].val == "in":
			op = "notin"
			p.next()
			p.next()
		}
		if op == "" {
			break
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
	if len(ops) == 0 {
		return first, nil
	}
	return &compareExpr{first, ops, rest, pos}, nil
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		t := p.next()
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &binExpr{t.val, l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	for p.isOp("~") {
		t := p.next()
		r, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		l = &binExpr{"~", l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		t := p.next()
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{t.val, l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.isOp("**") {
		t := p.next()
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{"**", l, r, t.pos}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	var e expr
	var err error
	switch {
	case p.isOp("-") || p.isOp("+"):
		t := p.next()
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{t.val, x}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.val {
		case "true", "True":
			return &constExpr{true}, nil
		case "false", "False":
			return &constExpr{false}, nil
		case "none", "None":
			return &constExpr{nil}, nil
		}
		return &nameExpr{t.val, t.pos}, nil
	case tString:
		s := t.val
		// adjacent string literals concatenate
		for p.peek().kind == tString {
			s += p.next().val
		}
		return &constExpr{s}, nil
	case tInt:
		v, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			f, ferr := strconv.ParseFloat(t.val, 64)
			if ferr != nil {
				return nil, p.errAt(t.pos, "bad number %q", t.val)
			}
			return &constExpr{f}, nil
		}
		return &constExpr{v}, nil
	case tFloat:
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			return nil, p.errAt(t.pos, "bad number %q", t.val)
		}
		return &constExpr{v}, nil
	case tOp:
		switch t.val {
		case "(":
			if p.isOp(")") {
				p.next()
				return &tupleExpr{}, nil
			}
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				items := []expr{e}
				for p.isOp(",") {
					p.next()
					if p.isOp(")") {
						break
					}
					x, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, x)
				}
				e = &tupleExpr{items}
			}
			return e, p.expectOp(")")
		case "[":
			var items []expr
			for !p.isOp("]") {
				if len(items) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("]") {
						break
					}
				}
				x, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				items = append(items, x)
			}
			p.next()
			return &listExpr{items}, nil
		case "{":
			d := &dictExpr{}
			for !p.isOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("}") {
						break
					}
				}
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys = append(d.keys, k)
				d.values = append(d.values, v)
			}
			p.next()
			return d, nil
		}
	}
	return nil, p.errAt(t.pos, "unexpected %s", describe(t))
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		t := p.peek()
		if t.kind != tOp {
			return e, nil
		}
		switch t.val {
		case ".":
			p.next()
			n := p.next()
			switch n.kind {
			case tName:
				e = &attrExpr{e, n.val, n.pos}
			case tInt:
				v, _ := strconv.ParseInt(n.val, 10, 64)
				e = &itemExpr{e, &constExpr{v}, n.pos}
			default:
				return nil, p.errAt(n.pos, "expected attribute name after '.', got %s", describe(n))
			}
		case "[":
			p.next()
			s, err := p.parseSubscript(e, t.pos)
			if err != nil {
				return nil, err
			}
			e = s
		case "(":
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}

func (p *parser) parseSubscript(obj expr, pos int) (expr, error) {
	var parts [3]expr
	n := 0
	isSlice := false
	for {
		if p.isOp(":") {
			p.next()
			isSlice = true
			n++
			if n > 2 {
				return nil, p.errAt(pos, "too many ':' in slice")
			}
			continue
		}
		if p.isOp("]") {
			p.next()
			break
		}
		if parts[n] != nil {
			return nil, p.errAt(p.peek().pos, "expected ']' or ':', got %s", describe(p.peek()))
		}
		x, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if !isSlice && p.isOp(",") { // x[a, b] → tuple key
			items := []expr{x}
			for p.isOp(",") {
				p.next()
				y, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				items = append(items, y)
			}
			x = &tupleExpr{items}
		}
		parts[n] = x
	}
	if !isSlice {
		if parts[0] == nil {
			return nil, p.errAt(pos, "empty subscript")
		}
		return &itemExpr{obj, parts[0], pos}, nil
	}
	return &sliceExpr{obj, parts[0], parts[1], parts[2]}, nil
}

func (p *parser) parseCallArgs() (args []expr, kwargs []kwArg, star, kwStar expr, err error) {
	if err = p.expectOp("("); err != nil {
		return
	}
	first := true
	for !p.isOp(")") {
		if !first {
			if err = p.expectOp(","); err != nil {
				return
			}
			if p.isOp(")") {
				break
			}
		}
		first = false
		switch {
		case p.isOp("*"):
			p.next()
			if star, err = p.parseExpr(); err != nil {
				return
			}
		case p.isOp("**"):
			p.next()
			if kwStar, err = p.parseExpr(); err != nil {
				return
			}
		case p.peek().kind == tName && p.toks[p.i+1].kind == tOp && p.toks[p.i+1].val == "=":
			name := p.next().val
			p.next()
			var v expr
			if v, err = p.parseExpr(); err != nil {
				return
			}
			kwargs = append(kwargs, kwArg{name, v})
		default:
			var v expr
			if v, err = p.parseExpr(); err != nil {
				return
			}
			if len(kwargs) > 0 {
				err = p.errAt(p.peek().pos, "positional argument after keyword argument")
				return
			}
			args = append(args, v)
		}
	}
	p.next()
	return
}

func (p *parser) parseCall(fn expr) (expr, error) {
	pos := p.peek().pos
	args, kwargs, star, kwStar, err := p.parseCallArgs()
	if err != nil {
		return nil, err
	}
	return &callExpr{fn, args, kwargs, star, kwStar, pos}, nil
}

func (p *parser) parseFilterCall(arg expr) (*filterExpr, error) {
	t, err := p.expectName()
	if err != nil {
		return nil, err
	}
	name := t.val
	for p.isOp(".") { // dotted filter names
		p.next()
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n.val
	}
	f := &filterExpr{arg: arg, name: name, pos: t.pos}
	if p.isOp("(") {
		args, kwargs, _, _, err := p.parseCallArgs()
		if err != nil {
			return nil, err
		}
		f.args, f.kwargs = args, kwargs
	}
	return f, nil
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			f, err := p.parseFilterCall(e)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			t := p.next()
			te := &testExpr{arg: e, pos: t.pos}
			if p.isName("not") {
				p.next()
				te.negate = true
			}
			n := p.next()
			switch {
			case n.kind == tName:
				te.name = n.val
			case n.kind == tOp && (n.val == "==" || n.val == "!=" || n.val == "<" || n.val == ">" || n.val == "<=" || n.val == ">="):
				te.name = n.val
			default:
				return nil, p.errAt(n.pos, "expected a test name after 'is', got %s", describe(n))
			}
			for p.isOp(".") {
				p.next()
				m, err := p.expectName()
				if err != nil {
					return nil, err
				}
				te.name += "." + m.val
			}
			nt := p.peek()
			switch {
			case p.isOp("("):
				args, _, _, _, err := p.parseCallArgs()
				if err != nil {
					return nil, err
				}
				te.args = args
			case (nt.kind == tName || nt.kind == tString || nt.kind == tInt || nt.kind == tFloat ||
				(nt.kind == tOp && (nt.val == "[" || nt.val == "{"))) &&
				!(nt.kind == tName && (nt.val == "else" || nt.val == "or" || nt.val == "and" || nt.val == "if" || nt.val == "is" || nt.val == "in" || nt.val == "not")):
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				if a, err = p.parsePostfix(a); err != nil {
					return nil, err
				}
				te.args = []expr{a}
			}
			e = te
		case p.isOp("("):
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}
