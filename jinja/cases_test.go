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
	data, err := os.ReadFile("testdata/cases.json")
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
	if len(file.Cases) < 80 {
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
