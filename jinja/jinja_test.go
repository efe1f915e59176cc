package jinja

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func render(t *testing.T, src string, vars map[string]any) string {
	t.Helper()
	tpl, err := Parse(src)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	out, err := tpl.Execute(vars)
	if err != nil {
		t.Fatalf("Execute(%q): %v", src, err)
	}
	return out
}

func TestSyntaxErrorPosition(t *testing.T) {
	cases := []struct {
		src       string
		line, col int
	}{
		{"hello\n{% if %}", 2, 7},
		{"a\nb\n  {{ 1 + }}", 3, 10},
		{"{% for x in y %}\n{% endif %}", 2, 4},
		{"{{ 'open", 1, 4},
		{"ok\n\n{# never closed", 3, 1},
		{"{% frobnicate %}", 1, 4},
		{"é{{ @ }}", 1, 5},
	}
	for _, c := range cases {
		_, err := Parse(c.src)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a SyntaxError", c.src, err)
			continue
		}
		if se.Line != c.line || se.Col != c.col {
			t.Errorf("Parse(%q): error at %d:%d, want %d:%d (%v)", c.src, se.Line, se.Col, c.line, c.col, err)
		}
		if !strings.Contains(err.Error(), "jinja: syntax error at") {
			t.Errorf("error text %q lacks position prefix", err)
		}
	}
}

func TestUndefinedSemantics(t *testing.T) {
	got := render(t, "[{{ foo }}][{{ foo.bar.baz }}][{{ foo.bar is defined }}][{% for x in foo.items %}x{% endfor %}][{{ foo | length }}][{{ foo | default('d') }}]", nil)
	if want := "[][][False][][0][d]"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	for _, src := range []string{"{{ foo() }}", "{{ foo + 1 }}", "{{ foo.bar() }}"} {
		tpl, _ := Parse(src)
		if _, err := tpl.Execute(nil); err == nil {
			t.Errorf("%s: calling or adding an undefined value must fail", src)
		}
	}
	_, err := mustParse(t, "x\n{{ missing() }}").Execute(nil)
	var re *RuntimeError
	if !errors.As(err, &re) || re.Line != 2 || !strings.Contains(err.Error(), "'missing' is undefined") {
		t.Fatalf("got %v, want a line-2 error naming 'missing'", err)
	}
}

func mustParse(t *testing.T, src string) *Template {
	t.Helper()
	tpl, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func TestExtras(t *testing.T) {
	vars := map[string]any{"csv": "a,b,,c"}
	cases := []struct{ src, want string }{
		// split filter (not in Jinja 3.1, asked for by the brief)
		{"{{ csv | split(',') | list }}", "['a', 'b', '', 'c']"},
		{"{{ 'a b  c' | split | length }}", "3"},
		// list mutation (HF's sandbox forbids it; we allow it)
		{"{% set l = [] %}{% do l.append(1) %}{{ l.append(2) }}{{ l }}", "None[1, 2]"},
		{"{% set d = {} %}{% do d.update({'a': 1}) %}{{ d }}", "{'a': 1}"},
		{"{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}", "aba"},
		{"{% set j = joiner('|') %}{% for i in range(3) %}{{ j() }}{{ i }}{% endfor %}", "0|1|2"},
		{"{% generation %}kept{% endgeneration %}", "kept"},
		{"{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}{% endif %}{% endfor %}", "(1(2))(3)"},
		{"{{ '%05.1f|%-3s|%r' % (3.14159, 'a', 'b') }}", "003.1|a  |'b'"},
		{"{{ 'x' is startingwith('x') }}{{ 'abc' is endingwith('bc') }}", "TrueTrue"},
	}
	for _, c := range cases {
		if got := render(t, c.src, vars); got != c.want {
			t.Errorf("%s: got %q want %q", c.src, got, c.want)
		}
	}
}

func TestStrftimeNow(t *testing.T) {
	tpl := mustParse(t, `{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%Y-%m-%d %H:%M:%S %A %B %-d %j %p") }}`)
	tpl.Now = func() time.Time { return time.Date(2024, 7, 6, 15, 4, 5, 0, time.UTC) }
	out, err := tpl.Execute(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "06 Jul 2024|2024-07-06 15:04:05 Saturday July 6 188 PM"; out != want {
		t.Fatalf("got %q want %q", out, want)
	}
}

func TestGoValues(t *testing.T) {
	type inner struct {
		Name string `json:"name"`
		Skip string `json:"-"`
		Opt  string `json:"opt,omitempty"`
		N    int
	}
	vars := map[string]any{
		"s":   []inner{{Name: "a", N: 1}, {Name: "b", Opt: "o"}},
		"m":   map[string]int{"z": 1, "a": 2},
		"raw": json.RawMessage(`{"z": 1, "a": [true, null, 1.50, 2]}`),
		"f32": float32(0.5),
	}
	got := render(t, "{{ s | map(attribute='name') | join }} {{ s[0] | tojson }} {{ s[1] | tojson }} {{ m | tojson }} {{ raw | tojson }} {{ f32 }}", vars)
	want := `ab {"name": "a", "N": 1} {"name": "b", "opt": "o", "N": 0} {"a": 2, "z": 1} {"z": 1, "a": [true, null, 1.5, 2]} 0.5`
	if got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if _, err := mustParse(t, "x").Execute(map[string]any{"c": make(chan int)}); err == nil {
		t.Fatal("a channel variable must be rejected")
	}
}

func TestLimits(t *testing.T) {
	cases := []struct {
		src  string
		want string
	}{
		{"{% for i in range(100000000) %}{% endfor %}", "step limit"},
		{"{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(10) %}{% endfor %}{% endfor %}{% endfor %}", "loop iterations"},
		{"{{ 'x' * 100000000 }}", "exceeds"},
		{"{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "exceeds"},
		{"{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 10 }}{% endfor %}", "exceeds"},
		{"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested deeper"},
		{"{{ [1, 2] * 10000000 }}", "items"},
		{"{{ ('x' * 1000) | replace('x', 'y' * 100000) }}", "exceeds"},
		{"{{ '%999999999s' % 'x' }}", "too large"},
		{"{{ [1] | batch(100000000000, 0) | list }}", "step limit"},
	}
	for _, c := range cases {
		tpl := mustParse(t, c.src)
		tpl.MaxOutput = 1 << 20
		tpl.MaxSteps = 100000
		_, err := tpl.Execute(nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.src, err, c.want)
		}
	}
	deep := strings.Repeat("(", 10000) + "1" + strings.Repeat(")", 10000)
	if _, err := Parse("{{ " + deep + " }}"); err == nil || !strings.Contains(err.Error(), "nesting") {
		t.Errorf("deep nesting: %v", err)
	}
	if _, err := Parse("{{ " + strings.Repeat("not ", 10000) + "1 }}"); err == nil {
		t.Error("deep not chain accepted")
	}
	if _, err := Parse(strings.Repeat("{% if x %}", 5000)); err == nil {
		t.Error("deep if nesting accepted")
	}
}

func TestConcurrentExecute(t *testing.T) {
	tpl := mustParse(t, "{% set ns = namespace(n=0) %}{% for m in msgs %}{% set ns.n = ns.n + m %}{% endfor %}{{ ns.n }}")
	done := make(chan string)
	for i := 0; i < 8; i++ {
		go func() {
			out, _ := tpl.Execute(map[string]any{"msgs": []int{1, 2, 3}})
			done <- out
		}()
	}
	for i := 0; i < 8; i++ {
		if got := <-done; got != "6" {
			t.Fatalf("got %q", got)
		}
	}
}

// FuzzParse: any input either fails to parse or renders (or errors) within
// the limits, without panicking or hanging.
func FuzzParse(f *testing.F) {
	seeds := []string{
		"Hello {{ name }}!", "{% for m in messages %}{{ m.role }}{% endfor %}",
		"{%- if x -%}a{%- elif y %}b{% else %}c{% endif %}", "{% set ns = namespace(a=1) %}{{ ns.a }}",
		"{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1) }}", "{% raw %}{{ x }}{% endraw %}",
		"{{ [1, 2, 3] | map('string') | join(',') }}", "{{ x[::-1] }}", "{# c #}", "{{ 'a' if b else 'c' }}",
		"{% call(x) m() %}{{ x }}{% endcall %}", "{{ {'a': [1, {'b': none}]} | tojson(indent=2) }}",
		"{% for i in range(10) %}{% if i > 3 %}{% break %}{% endif %}{{ loop.index }}{% endfor %}",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	vars := map[string]any{
		"name": "x", "x": []int{1, 2}, "b": true, "messages": []map[string]any{{"role": "user", "content": "hi"}},
	}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Line < 1 || se.Col < 1 {
				t.Fatalf("Parse error without position: %v", err)
			}
			return
		}
		tpl.MaxOutput = 1 << 16
		tpl.MaxSteps = 10000
		out, err := tpl.Execute(vars)
		if err == nil && len(out) > 1<<16 {
			t.Fatalf("output %d bytes exceeds the cap", len(out))
		}
	})
}
