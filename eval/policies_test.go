package eval

import (
	"strings"
	"testing"
)

func TestPolicyItems(t *testing.T) {
	for _, s := range []string{"streaming:sinks=4,window=60", "f16+quest:budget=64", "h2o:heavy=0.1,recent=0.1", "snapkv:capacity=64", "streaming:sinks=0,window=32"} {
		c, err := Parse(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if c.Setup.Policy == nil || c.Setup.Policy() == nil {
			t.Fatalf("%s: no policy", s)
		}
		if a, b := c.Setup.Policy(), c.Setup.Policy(); a == nil || b == nil {
			t.Fatalf("%s: policy maker returned nil", s)
		}
	}
	for _, s := range []string{"streaming:sinks=x", "quest:bogus=1", "h2o:heavy=-1"} {
		if _, err := Parse(s); err == nil || !strings.Contains(err.Error(), "kvcache") {
			t.Fatalf("%s: got %v", s, err)
		}
	}
}
