package kernels

import (
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"pagoda/quant"
)

// forEachISA runs f in parallel once per instruction set this CPU has, each
// with its own Ops, so every SIMD kernel is held against the same
// expectations as the generic path.
func forEachISA(t *testing.T, f func(t *testing.T, o *Ops)) {
	t.Parallel()
	for _, name := range ISAs() {
		o, err := ForISA(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, o)
		})
	}
}

// TestISASets: the reported sets, lookups and the start-up choice agree.
func TestISASets(t *testing.T) {
	t.Parallel()
	names := ISAs()
	if names[len(names)-1] != "generic" || Generic().Name() != "generic" {
		t.Fatalf("ISAs() = %v, Generic() = %q: generic must come last", names, Generic().Name())
	}
	if ISA() != Best().Name() {
		t.Fatalf("ISA() = %q, Best() is %q", ISA(), Best().Name())
	}
	for _, n := range names {
		o, err := ForISA(n)
		if err != nil || o.Name() != n {
			t.Fatalf("ForISA(%q) = %v, %v", n, o, err)
		}
	}
	if _, err := ForISA("sse9"); err == nil {
		t.Fatal("ForISA accepted an unknown instruction set")
	}
	if got := chooseISA(isaSets, "sse9"); got != isaSets[0] {
		t.Fatalf("unknown PAGODA_ISA chose %q, want the best (%q)", got.name, isaSets[0].name)
	}
	if got := chooseISA(isaSets, "generic"); got != Generic() {
		t.Fatalf("PAGODA_ISA=generic chose %q", got.name)
	}
}

// TestGenericIsPlainGo: every kernel of the generic set is a plain Go
// reference, so Generic (and model.Options.Reference) never reaches the
// assembly, whatever the CPU.
func TestGenericIsPlainGo(t *testing.T) {
	t.Parallel()
	g := Generic()
	if g.packed || g.asmQuant || g.avx2 {
		t.Fatalf("generic set selects SIMD paths: %+v", *g)
	}
	v := reflect.ValueOf(g).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() != reflect.Func {
			continue
		}
		if f.IsNil() {
			t.Fatalf("generic %s is nil", v.Type().Field(i).Name)
		}
		name := runtime.FuncForPC(f.Pointer()).Name()
		if !strings.HasSuffix(name, "Ref") {
			t.Errorf("generic %s runs %s, not a *Ref function", v.Type().Field(i).Name, name)
		}
	}
	// Every set is complete: a nil kernel would only show at the first call.
	for _, o := range isaSets {
		v := reflect.ValueOf(o).Elem()
		for i := 0; i < v.NumField(); i++ {
			if f := v.Field(i); f.Kind() == reflect.Func && f.IsNil() {
				t.Errorf("%s: %s is nil", o.name, v.Type().Field(i).Name)
			}
		}
	}
}

// TestPrepackedThroughGeneric: a Matrix packed for each SIMD set still
// multiplies, through Generic, bit for bit like MatMulRef on an unpacked
// copy (the generic path reads Data), and Generic's Prepack packs nothing.
func TestPrepackedThroughGeneric(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(21, 22))
	const rows, cols, batch = 33, 256, 3
	x := randF32(r, batch*cols)
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K, quant.Q6_K, quant.F16} {
		m, _ := randMatrix(t, r, typ, rows, cols)
		plain := *m
		want := make([]float32, batch*rows)
		MatMulRef(nil, &plain, x, want, batch)

		Generic().Prepack(nil, m)
		if m.pk != [2]unsafe.Pointer{} {
			t.Fatalf("%s: Generic().Prepack packed the matrix", typ)
		}
		for _, o := range isaSets {
			o.Prepack(nil, m)
			if o.packed && layoutOf(m, o) == nil {
				t.Fatalf("%s: %s.Prepack left no layout", typ, o.name)
			}
		}
		got := make([]float32, batch*rows)
		Generic().MatMul(nil, m, x, got, batch)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: generic out[%d] = %g after packing, %g before", typ, i, got[i], want[i])
			}
		}
	}
}

func layoutOf(m *Matrix, o *Ops) unsafe.Pointer { return m.pk[packSlot(o.avx2)] }
