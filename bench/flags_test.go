package bench

import (
	"reflect"
	"testing"
)

func TestParseLogitBias(t *testing.T) {
	m, err := ParseLogitBias("0-2:-100, 7:2.5")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, map[int]float64{0: -100, 1: -100, 2: -100, 7: 2.5}) {
		t.Fatalf("%v", m)
	}
	if m, _ := ParseLogitBias("0-258:-100"); len(m) != 259 || m[258] != -100 {
		t.Fatalf("reference ban: %d ids", len(m))
	}
	for _, bad := range []string{"5", "a:1", "5:x", "5:101", "9-3:1", "-1:2", "0-99999999:1"} {
		if _, err := ParseLogitBias(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseRate(t *testing.T) {
	for s, want := range map[string]float64{"inf": 0, "INF": 0, "2.5": 2.5} {
		if r, err := ParseRate(s); err != nil || r != want {
			t.Errorf("%q: %v %v", s, r, err)
		}
	}
	for _, bad := range []string{"0", "-1", "fast"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
