package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestRenameDepth(t *testing.T) {
	got := renameDepth(map[string][]float64{"tg128 @ d4096": {1, 2}, "pp512": {3}}, "q8_0")
	want := map[string][]float64{"tg128 @ d4096 kv=q8_0": {1, 2}, "pp512 kv=q8_0": {3}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v", got)
	}
	// Without a KV format a pp test keeps its plain name.
	if got := renameDepth(map[string][]float64{"pp512": {3}}, ""); !reflect.DeepEqual(got, map[string][]float64{"pp512": {3}}) {
		t.Fatalf("%v", got)
	}
	if depthTest(128, 4096, "") != "tg128 @ d4096 kv=f16" {
		t.Fatal(depthTest(128, 4096, ""))
	}
}

func TestParseTimings(t *testing.T) {
	r, err := parseTimings(strings.NewReader(`{"content":"x","timings":{"predicted_n":128,"predicted_per_second":21.5}}`), 128)
	if err != nil || r != 21.5 {
		t.Fatalf("%v %v", r, err)
	}
	for _, bad := range []string{
		`{"timings":{"predicted_n":100,"predicted_per_second":21.5}}`,
		`{"error":{"message":"context full"}}`,
		`not json`,
	} {
		if _, err := parseTimings(strings.NewReader(bad), 128); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if m := buildRe.FindStringSubmatch("main: build: 4798 (c392e509) with cc"); m == nil || m[1] != "c392e509" {
		t.Fatalf("%v", m)
	}
}

func TestDepthFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-llama", "x", "-m", "a", "-d", "4096"}, // pp not 0
		{"-llama", "x", "-m", "a", "-p", "0", "-d", "64", "-peer-depth", "cli"},
		{"-llama", "x", "-m", "a", "-p", "0", "-d", "-1"},
	} {
		if err := run(args, &strings.Builder{}, &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
