package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"pagoda/kvcache"
	"pagoda/model"
	"pagoda/testutil"
)

// TestControlPlane: the workers' control plane is gRPC on their one
// port. The standard health service answers; a join of an unknown kind
// and a leave of an unknown token are refused with gRPC status codes; a
// group whose ranks joined but whose coordinator left (another worker
// failed) releases the workers at once, so the next group forms.
func TestControlPlane(t *testing.T) {
	path := filepath.Join(testutil.Shared(t, "golden/models"), "g-llama-gqa.F32.gguf")
	addrs := startWorkers(t, path, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cc, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hr, err)
	}
	var j joined
	err = cc.Invoke(ctx, joinMethod, &hello{Kind: "peer"}, &j, grpc.CallContentSubtype("json"))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a join of kind peer: %v", err)
	}
	err = cc.Invoke(ctx, leaveMethod, &leaveRequest{Token: "nope"}, &struct{}{}, grpc.CallContentSubtype("json"))
	if status.Code(err) != codes.NotFound {
		t.Errorf("a leave of an unknown token: %v", err)
	}

	// Both ranks join (the mesh forms), then the coordinator leaves
	// without opening their step connections.
	coord, err := OpenShape(path, 2, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	kc := kvcache.Config{NLayer: coord.Config.NLayer, NKVHead: coord.Config.NKVHead, HeadDim: coord.Config.HeadDim, NumBlocks: 16}
	o := GroupOptions{Model: &coord.Config, KV: kc, Threads: 1, Timeout: time.Minute}
	spec, err := specOf(kc, "tensor parallel", false)
	if err != nil {
		t.Fatal(err)
	}
	hellos := groupHellos(addrs, o, spec)
	tokens := make([]string, 2)
	var wg sync.WaitGroup
	for r, a := range addrs {
		wg.Go(func() {
			c, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			var j joined
			if err := c.Invoke(ctx, joinMethod, &hellos[r], &j, grpc.CallContentSubtype("json")); err != nil {
				t.Errorf("rank %d: join: %v", r, err)
				return
			}
			if j.Model == nil || j.Token == "" {
				t.Errorf("rank %d: join answered %+v", r, j)
			}
			tokens[r] = j.Token
			// Joined: a second group is refused while this one holds it.
			if r == 0 {
				err := c.Invoke(ctx, joinMethod, &hellos[r], &joined{}, grpc.CallContentSubtype("json"))
				if err == nil || !strings.Contains(err.Error(), "already serves a group") {
					t.Errorf("a second join: %v", err)
				}
			}
			if err := c.Invoke(ctx, leaveMethod, &leaveRequest{Token: j.Token}, &struct{}{}, grpc.CallContentSubtype("json")); err != nil {
				t.Errorf("rank %d: leave: %v", r, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// A step connection naming a token that left is refused.
	if _, err := stepConn(ctx, addrs[0], tokens[0]); err == nil || !strings.Contains(err.Error(), "no joined session") {
		t.Errorf("a step connection after the leave: %v", err)
	}
	start := time.Now()
	g, err := Connect(addrs, o)
	if err != nil {
		t.Fatalf("the next group: %v", err)
	}
	g.Close()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the next group took %v to form: the left session held the workers", d)
	}
}
