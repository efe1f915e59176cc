package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"pagoda/engine"
	"pagoda/kvcache"
	"pagoda/testutil"
)

// kvLine is one NDJSON line of GET /v1/kv_events: a batch, or a heartbeat
// (next_seq only).
type kvLine struct {
	Seq     *uint64 `json:"seq"`
	TS      float64 `json:"ts"`
	NextSeq *uint64 `json:"next_seq"`
	Events  []struct {
		Type        string   `json:"type"`
		BlockHashes []uint64 `json:"block_hashes"`
		Parent      *uint64  `json:"parent_block_hash"`
		TokenIDs    []int32  `json:"token_ids"`
		BlockSize   int      `json:"block_size"`
		LoraID      *int     `json:"lora_id"`
		Medium      string   `json:"medium"`
	} `json:"events"`
}

// kvIndex is a router's view of one replica, built from its events.
type kvIndex struct {
	blocks  map[uint64]bool
	next    uint64 // the batch expected next
	removed int
	err     error // the first thing a router could not accept
}

func (x *kvIndex) apply(l kvLine) {
	if l.Seq == nil {
		return // heartbeat
	}
	if *l.Seq != x.next && x.err == nil {
		x.err = fmt.Errorf("batch %d after %d: a gap", *l.Seq, x.next)
	}
	x.next = *l.Seq + 1
	for _, e := range l.Events {
		switch e.Type {
		case "BlockStored":
			if e.BlockSize <= 0 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize || e.LoraID != nil || e.Medium != "CPU" {
				x.err = fmt.Errorf("bad BlockStored %+v", e)
			}
			for _, h := range e.BlockHashes {
				x.blocks[h] = true
			}
		case "BlockRemoved":
			for _, h := range e.BlockHashes {
				if !x.blocks[h] && x.err == nil {
					x.err = fmt.Errorf("removed %x, never stored", h)
				}
				delete(x.blocks, h)
				x.removed++
			}
		case "AllBlocksCleared":
			clear(x.blocks)
		default:
			x.err = fmt.Errorf("event type %q", e.Type)
		}
	}
}

// readKVEvents applies the NDJSON lines of body to x, under mu, until
// the body ends.
func readKVEvents(t *testing.T, body io.Reader, x *kvIndex, mu *sync.Mutex) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l kvLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("line %q: %v", sc.Text(), err)
			return
		}
		mu.Lock()
		x.apply(l)
		mu.Unlock()
	}
}

// TestKVEventsHTTP serves stories260K with a KV cache too small for its
// workload (concurrent requests that share prompt prefixes, some aborted
// mid-stream), follows GET /v1/kv_events from the start while it runs,
// and checks that the index the events build equals the blocks the
// engine's prefix cache holds at the end; a replay with ?since=0 builds
// the same.
func TestKVEventsHTTP(t *testing.T) {
	path := testutil.Shared(t, "models/gguf/stories260K.gguf")
	log := kvcache.NewEventLog(1 << 14)
	m, eng := storiesEngine(t, path, func(c *engine.Config) { c.KVBlocks, c.KVEvents, c.MaxNumSeqs = 14, log, 6 })
	be, err := NewEngineBackend(eng, m.Tokenizer(), "stories260K", m.Config.ContextLen, "")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(be, Options{KVEvents: log}).Handler())
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if resp, b := get(t, ts, "/v1/kv_events?since=x"); resp.StatusCode != 400 {
		t.Fatalf("since=x: %d %s", resp.StatusCode, b)
	}
	follow := &kvIndex{blocks: map[uint64]bool{}}
	var mu sync.Mutex
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/v1/kv_events?since=0", nil)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("follow: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		readKVEvents(t, resp.Body, follow, &mu)
	}()

	kvEventsWorkload(t, ctx, ts, eng)
	bm, err := eng.Blocks(ctx) // between steps: after the last step's batch
	if err != nil {
		t.Fatal(err)
	}
	want := log.Next()
	for {
		mu.Lock()
		n := follow.next
		mu.Unlock()
		if n >= want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("follower stuck at batch %d of %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp.Body.Close()
	<-followed
	replayed := &kvIndex{blocks: map[uint64]bool{}}
	rresp, b := get(t, ts, "/v1/kv_events?since=0&stream=false")
	if rresp.StatusCode != 200 {
		t.Fatalf("replay: %d %s", rresp.StatusCode, b)
	}
	readKVEvents(t, strings.NewReader(string(b)), replayed, &mu)
	st := eng.Stats()
	if st.PrefixHits == 0 || replayed.removed == 0 {
		t.Fatalf("workload too tame: %d prefix hits, %d blocks evicted", st.PrefixHits, replayed.removed)
	}
	for name, x := range map[string]*kvIndex{"followed": follow, "replayed": replayed} {
		if x.err != nil {
			t.Fatalf("%s: %v", name, x.err)
		}
		if len(x.blocks) != len(bm.Hashes) {
			t.Fatalf("%s index holds %d blocks, the pool %d", name, len(x.blocks), len(bm.Hashes))
		}
		for _, h := range bm.Hashes {
			if !x.blocks[h] {
				t.Fatalf("%s index lacks %x, which the pool holds", name, h)
			}
		}
	}
	t.Logf("%d batches, %d blocks held, %d evicted, %d preemptions, prefix hits %d/%d tokens", want, len(bm.Hashes), replayed.removed, st.Preemptions, st.PrefixHits, st.PrefixQueries)
}

// kvEventsWorkload runs 24 completions (12 with -short), 6 at a time, over prompts from
// four families that share their first 40 tokens, every fifth one
// streamed and dropped after its first chunk.
func kvEventsWorkload(t *testing.T, ctx context.Context, ts *httptest.Server, eng *engine.Engine) {
	r := rand.New(rand.NewPCG(3, 4))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	n := 24
	if testing.Short() {
		n = 12
	}
	for i := range n {
		fam := i % 4
		p := make([]int32, 40+r.IntN(40))
		for j := range p {
			p[j] = int32(3 + (fam*97+j*13)%500)
			if j >= 40 {
				p[j] = 3 + r.Int32N(500)
			}
		}
		pj, _ := json.Marshal(p)
		abort := i%5 == 4
		body := fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":%v}`, pj, 16+r.IntN(32), abort)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			req, _ := http.NewRequestWithContext(rctx, "POST", ts.URL+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Errorf("%d %s", resp.StatusCode, b)
				return
			}
			if abort {
				bufio.NewReader(resp.Body).ReadString('\n') // the first chunk, then leave
				return
			}
			io.Copy(io.Discard, resp.Body)
		}()
	}
	wg.Wait()
	// An aborted request's blocks go back when the engine sees the
	// cancellation: wait until nothing runs.
	for eng.Stats().Running+eng.Stats().Waiting > 0 {
		if ctx.Err() != nil {
			t.Fatal("requests still running after the workload")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKVEventsWire: a batch goes out in vLLM's shape, a chain of stored
// blocks as one BlockStored (token ids end to end, the first block's
// parent, null for a sequence's first), a run of removals as one
// BlockRemoved; a server without an event log answers 404 and bad
// parameters 400.
func TestKVEventsWire(t *testing.T) {
	tok := func(n int32) []int32 { return []int32{n, n + 1} }
	b := kvcache.EventBatch{Seq: 3, Time: time.Unix(1700000000, 500000000), Events: []kvcache.BlockEvent{
		{Kind: kvcache.AllBlocksCleared},
		{Kind: kvcache.BlockStored, Hash: 11, Tokens: tok(1)},
		{Kind: kvcache.BlockStored, Hash: 12, Parent: 11, HasParent: true, Tokens: tok(3)},
		{Kind: kvcache.BlockStored, Hash: 21, Parent: 20, HasParent: true, Tokens: tok(5)},
		{Kind: kvcache.BlockRemoved, Hash: 11},
		{Kind: kvcache.BlockRemoved, Hash: 18446744073709551615},
		{Kind: kvcache.BlockStored, Hash: 13, Parent: 12, HasParent: true, Tokens: tok(7)},
	}}
	got, err := json.Marshal(kvBatchWire(b, 2))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"seq":3,"ts":1700000000.5,"events":[{"type":"AllBlocksCleared"},` +
		`{"type":"BlockStored","block_hashes":[11,12],"parent_block_hash":null,"token_ids":[1,2,3,4],"block_size":2,"lora_id":null,"medium":"CPU"},` +
		`{"type":"BlockStored","block_hashes":[21],"parent_block_hash":20,"token_ids":[5,6],"block_size":2,"lora_id":null,"medium":"CPU"},` +
		`{"type":"BlockRemoved","block_hashes":[11,18446744073709551615],"medium":"CPU"},` +
		`{"type":"BlockStored","block_hashes":[13],"parent_block_hash":12,"token_ids":[7,8],"block_size":2,"lora_id":null,"medium":"CPU"}]}`
	if string(got) != want {
		t.Fatalf("wire batch\n got %s\nwant %s", got, want)
	}
	if b.Events[1].Tokens[0] != 1 || len(b.Events[1].Tokens) != 2 {
		t.Fatal("encoding a chain wrote into the pool's token slices")
	}

	ts := startServer(t, newFake(), Options{})
	if resp, body := get(t, ts, "/v1/kv_events"); resp.StatusCode != 404 {
		t.Fatalf("no event log: %d %s", resp.StatusCode, body)
	}
	ts = startServer(t, newFake(), Options{KVEvents: kvcache.NewEventLog(4)})
	for _, q := range []string{"since=-1", "since=x", "stream=maybe"} {
		if resp, body := get(t, ts, "/v1/kv_events?"+q); resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
	if resp, body := get(t, ts, "/v1/kv_events?stream=false"); resp.StatusCode != 200 || len(body) != 0 {
		t.Fatalf("nothing kept: %d %q", resp.StatusCode, body)
	}
}
