package executor

import (
	"reflect"
	"testing"

	"pagoda/model"
)

func TestMergeReports(t *testing.T) {
	a := []model.KVReport{
		{Seq: 1, Sealed: -1, Dead: []int32{0, 4, 6, 9}},
		{Seq: 2, Sealed: 40, Dead: []int32{1, 3}},
		{Seq: 3, Sealed: 8},
		{Seq: 1, Sealed: 12, Dead: []int32{0, 5, 6, 10}}, // a later micro-batch: replaces the first
	}
	b := []model.KVReport{
		{Seq: 2, Sealed: 32, Dead: []int32{0, 2}},
		{Seq: 1, Sealed: -1, Dead: []int32{2, 7, 8, 12}},
	}
	got := MergeReports([][]model.KVReport{a, b})
	want := []model.KVReport{
		{Seq: 1, Sealed: 12, Dead: []int32{2, 5, 6, 7, 8, 10}},
		// Sequence 3: only one part reported it, so nothing is known.
		{Seq: 2, Sealed: 32, Dead: []int32{1, 2}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	if got := MergeReports([][]model.KVReport{a[:1]}); !reflect.DeepEqual(got, a[:1]) {
		t.Fatalf("one part: %+v", got)
	}
	if got := MergeReports([][]model.KVReport{{{Seq: 4, Sealed: -1, Dead: []int32{0, 1}}}, {{Seq: 4, Sealed: -1}}}); len(got) != 1 || got[0].Dead != nil {
		t.Fatalf("nothing dead on one part: %+v", got)
	}
}
