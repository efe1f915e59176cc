package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"pagoda/kvcache"
)

// GET /v1/kv_events streams the engine's KV events (kvcache.EventLog) as
// NDJSON, one line per batch in vLLM's shape, for a prefix-aware router:
//
//	{"seq":7,"ts":1733212345.12,"events":[
//	  {"type":"BlockStored","block_hashes":[..],"parent_block_hash":null,"token_ids":[..],"block_size":16,"lora_id":null,"medium":"CPU"},
//	  {"type":"BlockRemoved","block_hashes":[..],"medium":"CPU"},
//	  {"type":"AllBlocksCleared"}]}
//
// ?since=SEQ replays the batches kept from SEQ on before following (a
// first line numbered above SEQ means the ones between were lost: rebuild
// the index); without it the stream starts at the next batch.
// ?stream=false answers what is kept and ends. A line {"next_seq":N}
// keeps an idle stream open and says where it stands.

// kvEventsMedium is where the blocks live: host memory, in vLLM's words.
const kvEventsMedium = "CPU"

// kvHeartbeat is how long an idle stream goes without a line: well under
// the write timeout, which would otherwise close it.
const kvHeartbeat = 15 * time.Second

type (
	kvBatchJSON struct {
		Seq    uint64  `json:"seq"`
		TS     float64 `json:"ts"`
		Events []any   `json:"events"`
	}
	kvStoredJSON struct {
		Type        string   `json:"type"`
		BlockHashes []uint64 `json:"block_hashes"`
		Parent      *uint64  `json:"parent_block_hash"`
		TokenIDs    []int32  `json:"token_ids"`
		BlockSize   int      `json:"block_size"`
		LoraID      *int     `json:"lora_id"`
		Medium      string   `json:"medium"`
	}
	kvRemovedJSON struct {
		Type        string   `json:"type"`
		BlockHashes []uint64 `json:"block_hashes"`
		Medium      string   `json:"medium"`
	}
	kvClearedJSON struct {
		Type string `json:"type"`
	}
)

// kvBatchWire is b as vLLM publishes it: a run of stored blocks that
// chain one onto the next is one BlockStored (its token ids end to end),
// a run of removals one BlockRemoved.
func kvBatchWire(b kvcache.EventBatch, blockSize int) kvBatchJSON {
	out := kvBatchJSON{Seq: b.Seq, TS: float64(b.Time.UnixNano()) / 1e9, Events: []any{}}
	var st *kvStoredJSON
	var rm *kvRemovedJSON
	for _, e := range b.Events {
		switch e.Kind {
		case kvcache.BlockStored:
			rm = nil
			if st != nil && e.HasParent && e.Parent == st.BlockHashes[len(st.BlockHashes)-1] {
				st.BlockHashes = append(st.BlockHashes, e.Hash)
				st.TokenIDs = append(st.TokenIDs, e.Tokens...)
				continue
			}
			st = &kvStoredJSON{Type: "BlockStored", BlockHashes: []uint64{e.Hash}, TokenIDs: append([]int32(nil), e.Tokens...),
				BlockSize: blockSize, Medium: kvEventsMedium}
			if e.HasParent {
				p := e.Parent
				st.Parent = &p
			}
			out.Events = append(out.Events, st)
		case kvcache.BlockRemoved:
			st = nil
			if rm != nil {
				rm.BlockHashes = append(rm.BlockHashes, e.Hash)
				continue
			}
			rm = &kvRemovedJSON{Type: "BlockRemoved", BlockHashes: []uint64{e.Hash}, Medium: kvEventsMedium}
			out.Events = append(out.Events, rm)
		case kvcache.AllBlocksCleared:
			st, rm = nil, nil
			out.Events = append(out.Events, kvClearedJSON{Type: "AllBlocksCleared"})
		}
	}
	return out
}

func (a kvEventsAPI) registerKVEvents(m *http.ServeMux) {
	m.HandleFunc("GET /v1/kv_events", a.auth(a.handleKVEvents))
}

func (a kvEventsAPI) handleKVEvents(w http.ResponseWriter, r *http.Request) {
	log := a.o.KVEvents
	if log == nil {
		writeAPIError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: "this server publishes no KV events (it runs with --kv-events 0 or --no-prefix-cache)"})
		return
	}
	q := r.URL.Query()
	from, follow := log.Next(), true
	if s := q.Get("since"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			writeAPIError(w, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "since",
				Message: fmt.Sprintf("since=%q: want a batch sequence number (a non-negative integer)", s)})
			return
		}
		from = n
	}
	if s := q.Get("stream"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			writeAPIError(w, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "stream",
				Message: fmt.Sprintf("stream=%q: want true or false", s)})
			return
		}
		follow = b
	}
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	a.streamKVEvents(w, r, log, from, follow)
}

// streamKVEvents writes the batches from from on, following the log while
// follow, until the client leaves or the server drains. It reads copies
// out of the log's ring, so a slow client only falls behind (and later
// sees a gap); the engine never waits for it.
func (a kvEventsAPI) streamKVEvents(w http.ResponseWriter, r *http.Request, log *kvcache.EventLog, from uint64, follow bool) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	bs := log.BlockSize()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	idle := time.Duration(0)
	var buf []kvcache.EventBatch
	for {
		var wake <-chan struct{}
		buf, wake = log.Read(from, buf[:0])
		for _, b := range buf {
			if enc.Encode(kvBatchWire(b, bs)) != nil {
				return
			}
			from = b.Seq + 1
		}
		if len(buf) > 0 {
			if rc.Flush() != nil {
				return
			}
			idle = 0
			continue
		}
		if !follow {
			return
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		case <-tick.C:
			if a.draining.Load() {
				return // a follower would hold the drain for its whole grace
			}
			if idle += time.Second; idle >= kvHeartbeat {
				idle = 0
				if enc.Encode(map[string]uint64{"next_seq": from}) != nil || rc.Flush() != nil {
					return
				}
			}
		}
	}
}
