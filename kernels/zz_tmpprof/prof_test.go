package zz

import (
	"os"
	"runtime/pprof"
	"testing"

	"pagoda/model"
	"pagoda/speed"
)

func TestProf(t *testing.T) {
	m, err := model.Open(os.Getenv("M"), model.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create("/tmp/model.prof")
	pprof.StartCPUProfile(f)
	r, err := speed.Run(m, speed.Test{Kind: os.Getenv("K"), N: 512}, 1, 512)
	pprof.StopCPUProfile()
	t.Log(r, err)
}
