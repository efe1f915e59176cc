package model_test

import (
	"math"
	"path/filepath"
	"testing"

	"pagoda/kernels"
	"pagoda/model"
	"pagoda/testutil"
)

// TestReferenceMatchesFast: Options.Reference (every forward-pass kernel
// from kernels.Generic) and the default (kernels.Best) give the same logits
// on a golden model, up to float32 summation order for float weights and,
// for Q4_0, the 8-bit activations the SIMD integer kernels use. Holds even
// where Best is generic (then the two are bit-identical).
func TestReferenceMatchesFast(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, tc := range []struct {
		file    string
		tol     float64 // max |Δlogit| relative to the row's logit range
		intActs bool    // the fast path quantizes activations
	}{
		{"g-llama-gqa.F32.gguf", 1e-5, false},
		{"g-llama-gqa.Q4_0.gguf", 2e-2, true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(dir, tc.file)
			open := func(reference bool) *model.Model {
				m, err := model.Open(path, model.Options{Threads: 2, Reference: reference})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Close() })
				return m
			}
			fast, ref := open(false), open(true)
			tokens := make([]int32, 24)
			for i := range tokens {
				tokens[i] = int32((i*7919 + 3) % fast.Config.VocabSize)
			}
			fr, rr := teacherForced(t, fast, tokens), teacherForced(t, ref, tokens)
			var worst float64
			for i := range fr {
				lo, hi := math.Inf(1), math.Inf(-1)
				var maxd float64
				for j, v := range rr[i] {
					lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
					maxd = math.Max(maxd, math.Abs(float64(fr[i][j]-v)))
				}
				if hi <= lo {
					t.Fatalf("position %d: flat reference logits", i)
				}
				worst = math.Max(worst, maxd/(hi-lo))
			}
			t.Logf("max |Δlogit| / range = %.3g", worst)
			if worst > tc.tol {
				t.Errorf("fast and reference logits differ by %.3g of the logit range (bound %g)", worst, tc.tol)
			}
			// The SIMD integer kernels quantize activations to 8 bits; the
			// references do not. Identical Q4_0 logits would mean Reference
			// never left the fast kernels.
			if kernels.ISA() != "generic" && tc.intActs && worst == 0 {
				t.Error("reference logits bit-identical to the fast ones: Reference did not switch kernels")
			}
		})
	}
}

// TestReferenceCaches: the caches built for a Reference model compute with
// the plain Go kernels, so no SIMD kernel hides in its attention.
func TestReferenceCaches(t *testing.T) {
	dir := testutil.Shared(t, "golden/models")
	for _, reference := range []bool{false, true} {
		m, err := model.Open(filepath.Join(dir, "g-llama-gqa.F32.gguf"), model.Options{Threads: 1, Reference: reference})
		if err != nil {
			t.Fatal(err)
		}
		want := kernels.Best()
		if reference {
			want = kernels.Generic()
		}
		if m.Ops() != want {
			t.Errorf("reference %v: model computes with %s, want %s", reference, m.Ops().Name(), want.Name())
		}
		if got := m.NewFlatCache(1, 4).Ops(); got != want {
			t.Errorf("reference %v: flat cache computes with %s, want %s", reference, got.Name(), want.Name())
		}
		m.Close()
	}
}
