package jinja

import (
	"fmt"
	"strings"
	"unicode"
)

func (s *state) evalTest(e *testExpr, f *frame) (any, error) {
	v, err := s.eval(e.arg, f)
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, len(e.args))
	for _, a := range e.args {
		x, err := s.eval(a, f)
		if err != nil {
			return nil, err
		}
		args = append(args, x)
	}
	ok, err := s.runTest(e.name, v, args)
	if err != nil {
		return nil, s.wrap(e.pos, err)
	}
	return ok != e.negate, nil
}

func (s *state) runTest(name string, v any, args []any) (bool, error) {
	arg := func() (any, error) {
		if len(args) < 1 {
			return nil, fmt.Errorf("test '%s' needs an argument", name)
		}
		return args[0], nil
	}
	cmp := func(op string) (bool, error) {
		a, err := arg()
		if err != nil {
			return false, err
		}
		return compareOp(op, v, a)
	}
	switch name {
	case "defined":
		_, u := v.(Undefined)
		return !u, nil
	case "undefined":
		_, u := v.(Undefined)
		return u, nil
	case "none":
		return v == nil, nil
	case "boolean":
		_, ok := v.(bool)
		return ok, nil
	case "true":
		b, ok := v.(bool)
		return ok && b, nil
	case "false":
		b, ok := v.(bool)
		return ok && !b, nil
	case "string":
		_, ok := v.(string)
		return ok, nil
	case "number":
		switch v.(type) {
		case int64, float64, bool:
			return true, nil
		}
		return false, nil
	case "integer":
		_, ok := v.(int64)
		return ok, nil
	case "float":
		_, ok := v.(float64)
		return ok, nil
	case "mapping":
		switch v.(type) {
		case *Dict:
			return true, nil
		}
		return false, nil
	case "iterable":
		switch v.(type) {
		case string, *List, *Dict, *Namespace, Undefined:
			return true, nil
		}
		return false, nil
	case "sequence":
		switch v.(type) {
		case string, *List, *Dict, Undefined:
			return true, nil
		}
		return false, nil
	case "callable":
		switch v.(type) {
		case builtin, boundMethod, *macro, *joiner:
			return true, nil
		}
		return false, nil
	case "odd", "even":
		i, ok := asInt(v)
		if !ok {
			return false, fmt.Errorf("test '%s' needs an integer, got %s", name, typeName(v))
		}
		return (i%2 != 0) == (name == "odd"), nil
	case "divisibleby":
		a, err := arg()
		if err != nil {
			return false, err
		}
		i, ok1 := asInt(v)
		n, ok2 := asInt(a)
		if !ok1 || !ok2 || n == 0 {
			return false, fmt.Errorf("divisibleby needs non-zero integers")
		}
		return i%n == 0, nil
	case "eq", "equalto", "==":
		return cmp("==")
	case "ne", "!=":
		return cmp("!=")
	case "lt", "lessthan", "<":
		return cmp("<")
	case "le", "<=":
		return cmp("<=")
	case "gt", "greaterthan", ">":
		return cmp(">")
	case "ge", ">=":
		return cmp(">=")
	case "in":
		a, err := arg()
		if err != nil {
			return false, err
		}
		return contains(a, v)
	case "sameas":
		a, err := arg()
		if err != nil {
			return false, err
		}
		if isNumber(v) || isNumber(a) {
			return equal(v, a) && typeName(v) == typeName(a), nil
		}
		return v == a || (v == nil && a == nil), nil
	case "lower", "upper":
		str, ok := v.(string)
		if !ok {
			return false, nil
		}
		if name == "lower" {
			return str == strings.ToLower(str), nil
		}
		return str == strings.ToUpper(str), nil
	case "startingwith", "endingwith":
		a, err := arg()
		if err != nil {
			return false, err
		}
		str, ok1 := v.(string)
		p, ok2 := a.(string)
		if !ok1 || !ok2 {
			return false, nil
		}
		if name == "startingwith" {
			return strings.HasPrefix(str, p), nil
		}
		return strings.HasSuffix(str, p), nil
	case "escaped":
		return false, nil
	case "filter":
		a, err := arg()
		if err != nil {
			return false, err
		}
		_, ok := filters[toStr(a)]
		return ok, nil
	case "test":
		a, err := arg()
		if err != nil {
			return false, err
		}
		return knownTests[toStr(a)], nil
	case "space":
		str, ok := v.(string)
		return ok && str != "" && strings.TrimFunc(str, unicode.IsSpace) == "", nil
	}
	return false, fmt.Errorf("no test named '%s'", name)
}

var knownTests = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`defined undefined none boolean true false string number integer float
		mapping iterable sequence callable odd even divisibleby eq equalto == ne != lt lessthan < le <=
		gt greaterthan > ge >= in sameas lower upper startingwith endingwith escaped filter test`) {
		knownTests[n] = true
	}
}
