package server

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"pagoda/engine"
	"pagoda/kvcache"
)

// webFiles is the page served at /: plain files, no build step, nothing
// fetched from elsewhere, so it works offline and under a strict CSP.
//
//go:embed web
var webFiles embed.FS

// EngineViewer is what GET /api/engine reads; *engine.Engine satisfies it.
type EngineViewer interface {
	Stats() engine.Stats
	Blocks(ctx context.Context) (kvcache.BlockMap, error)
}

// blocksTimeout bounds the wait for the engine loop to copy the block map:
// it answers between steps, and a slow step must not hang the page's poll.
const blocksTimeout = 2 * time.Second

// webCSP keeps the page to its own origin: a model's output is shown as
// text, and if it ever were not, no injected script or exfiltrating image
// could load.
const webCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (s webAPI) registerWeb(m *http.ServeMux) {
	sub, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	page := func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", webCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// Embedded files change only with the binary; revalidating is cheap
		// and an upgrade is seen at once.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}
	m.HandleFunc("GET /{$}", page)
	// Browsers ask for /favicon.ico whatever the page links.
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/favicon.png"
		page(w, r2)
	})
	m.Handle("GET /static/", http.StripPrefix("/static", http.HandlerFunc(page)))
	m.HandleFunc("GET /api/engine", s.auth(s.handleEngine))
}

// engineView is the JSON of GET /api/engine: engine.Stats in snake_case,
// plus the block map when asked for with ?blocks=1.
type engineView struct {
	TimeMS           int64      `json:"time_ms"`
	Model            string     `json:"model"`
	Running          int        `json:"running"`
	Waiting          int        `json:"waiting"`
	RunningSeqs      int        `json:"running_seqs"`
	InFlight         int64      `json:"in_flight"` // HTTP requests admitted by the server
	KV               kvView     `json:"kv"`
	PrefixQueries    uint64     `json:"prefix_queries"`
	PrefixHits       uint64     `json:"prefix_hits"`
	PrefixHitRate    float64    `json:"prefix_hit_rate"`
	Preemptions      uint64     `json:"preemptions"`
	Steps            uint64     `json:"steps"`
	PromptTokens     uint64     `json:"prompt_tokens"`
	GenerationTokens uint64     `json:"generation_tokens"`
	BatchedTokens    uint64     `json:"batched_tokens"`
	Blocks           *blockView `json:"blocks,omitempty"`
}

type kvView struct {
	Blocks     int     `json:"blocks"`
	BlockSize  int     `json:"block_size"`
	Used       int     `json:"used"`
	Free       int     `json:"free"`
	Cached     int     `json:"cached"`
	CachedFree int     `json:"cached_free"`
	Usage      float64 `json:"usage"`
}

// blockView carries one character per block ('0' free, '1' cached, '2'
// used, '3' used and shareable) rather than a JSON array: a pool of tens
// of thousands of blocks is polled every second.
type blockView struct {
	State string  `json:"state"`
	Owner []int32 `json:"owner"`
}

func (s webAPI) handleEngine(w http.ResponseWriter, r *http.Request) {
	ev := s.o.Engine
	if ev == nil {
		writeAPIError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "this server has no engine view"})
		return
	}
	st := ev.Stats()
	v := engineView{
		TimeMS: time.Now().UnixMilli(), Model: s.b.ModelName(),
		Running: st.Running, Waiting: st.Waiting, RunningSeqs: st.RunningSeqs, InFlight: s.inflight.Load(),
		KV: kvView{Blocks: st.KV.Blocks, BlockSize: st.KV.BlockSize, Used: st.KV.Used, Free: st.KV.Free,
			Cached: st.KV.Cached, CachedFree: st.KV.CachedFree, Usage: st.KVUsage},
		PrefixQueries: st.PrefixQueries, PrefixHits: st.PrefixHits,
		Preemptions: st.Preemptions, Steps: st.Steps, PromptTokens: st.PromptTokens,
		GenerationTokens: st.GenerationTokens, BatchedTokens: st.BatchedTokens,
	}
	if st.PrefixQueries > 0 {
		v.PrefixHitRate = float64(st.PrefixHits) / float64(st.PrefixQueries)
	}
	if r.URL.Query().Get("blocks") == "1" {
		ctx, cancel := context.WithTimeout(r.Context(), blocksTimeout)
		m, err := ev.Blocks(ctx)
		cancel()
		if err == nil {
			var sb strings.Builder
			sb.Grow(len(m.State))
			for _, b := range m.State {
				sb.WriteByte('0' + byte(b))
			}
			v.Blocks = &blockView{State: sb.String(), Owner: m.Owner}
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, v)
}
