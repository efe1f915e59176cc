package kvcache

import (
	"strings"
	"testing"

	"pagoda/model"
)

// TestFollowerRefusesBadNotes: notes from a wire that name pages outside
// the storage, a policy that does not parse, a commit past what the
// sequence computed, a negative count or an unknown kind are errors, not
// panics, and leave the follower usable.
func TestFollowerRefusesBadNotes(t *testing.T) {
	f, err := NewFollower(Config{NLayer: 2, NKVHead: 1, HeadDim: 8, BlockSize: 4, NumBlocks: 8, DType: F32, Policy: NewH2O(2, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		note model.KVNote
		want string
	}{
		{model.KVNote{Op: model.NoteCopy, Seq: 8, N: 0}, "copies page"},
		{model.KVNote{Op: model.NoteCopy, Seq: 1, N: -1}, "negative"},
		{model.KVNote{Op: model.NoteBind, Seq: 1, Policy: "h2o:heavy=-1"}, "h2o"},
		{model.KVNote{Op: model.NoteBind, Seq: 1, Policy: "nonsense"}, "nonsense"},
		{model.KVNote{Op: model.NoteCommit, Seq: 1, N: 1 << 30}, "has computed 0"},
		{model.KVNote{Op: model.NoteCommit, Seq: 1, N: 0, Table: []int32{99}}, "page 99"},
		{model.KVNote{Op: model.NoteTruncate, Seq: 1, N: -4}, "negative"},
		{model.KVNote{Op: 200, Seq: 1}, "unknown note"},
	} {
		if err := f.Apply([]model.KVNote{tc.note}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.note, err, tc.want)
		}
	}
	// Still usable: a sequence bound, committed after a step, freed.
	ok := []model.KVNote{{Op: model.NoteBind, Seq: 1, Policy: "quest:budget=4,dense=0"}, {Op: model.NoteCommit, Seq: 1, N: 0, Table: []int32{0}}, {Op: model.NoteFree, Seq: 1}}
	if err := f.Apply(ok); err != nil {
		t.Fatal(err)
	}
	if seqs, pols := f.Policies.Bound(); seqs != 0 || pols != 0 {
		t.Fatalf("%d sequences bound to %d policies after the free", seqs, pols)
	}
}
