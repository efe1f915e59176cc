package kernels

import "testing"

// forEachISA runs f once per instruction set this CPU has, so every SIMD
// kernel is held against the same expectations as the generic path.
func forEachISA(t *testing.T, f func(t *testing.T)) {
	prev := ISA()
	defer SetISA(prev)
	for _, name := range ISAs() {
		if err := SetISA(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
}
