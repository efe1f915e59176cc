package jinja

import (
	"encoding/json"
	"os"
	"testing"
)

// TestCasesAgainstJinja2 runs every case in testdata/cases.json, whose
// expected outputs come from Python Jinja2 configured as transformers
// configures it (see testdata/gen_cases.py).
func TestCasesAgainstJinja2(t *testing.T) {
	runCaseFile(t, "testdata/cases.json", 80)
}

// TestRandomWhitespaceAgainstJinja2 covers whitespace control on random
// templates (testdata/gen_random.py).
func TestRandomWhitespaceAgainstJinja2(t *testing.T) {
	runCaseFile(t, "testdata/random_ws.json", 500)
}

// TestRandomStatementsAgainstJinja2 covers scoping and loop state on random
// nested statements (testdata/gen_random_stmt.py).
func TestRandomStatementsAgainstJinja2(t *testing.T) {
	runCaseFile(t, "testdata/random_stmt.json", 300)
}

func runCaseFile(t *testing.T, path string, minCases int) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vars  json.RawMessage
		Cases []struct {
			Template string
			Output   *string
			Error    string
		}
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	vars, err := FromJSON(file.Vars)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	d := vars.(*Dict)
	for _, k := range d.Keys() {
		v, _ := d.Get(k)
		m[k.(string)] = v
	}
	if len(file.Cases) < minCases {
		t.Fatalf("only %d cases", len(file.Cases))
	}
	for _, c := range file.Cases {
		tpl, err := Parse(c.Template)
		var got string
		if err == nil {
			got, err = tpl.Execute(m)
		}
		if c.Output == nil {
			if err == nil {
				t.Errorf("template %q: want error like %q, got output %q", c.Template, c.Error, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("template %q: unexpected error %v", c.Template, err)
			continue
		}
		if got != *c.Output {
			t.Errorf("template %q:\n got %q\nwant %q", c.Template, got, *c.Output)
		}
	}
}
