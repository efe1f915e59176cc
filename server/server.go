package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"pagoda/grammar"
	"pagoda/kvcache"
)

// Options configure a Server. The zero value is usable.
type Options struct {
	// APIKey, when set, is required as "Authorization: Bearer <key>" on
	// /v1/*, /tokenize and /detokenize (health, version and metrics stay
	// open, as in vLLM, unless MetricsAuth).
	APIKey string
	// MetricsAuth makes /metrics, /version and /api/version require
	// APIKey too (--metrics-auth): metrics name the model and reveal its
	// load, which a deployment may not want public. /health stays open
	// for load balancers. No effect without APIKey.
	MetricsAuth bool
	// Registry is served at /metrics and receives the server's own HTTP
	// metrics (pagoda:http_*). nil: no /metrics.
	Registry *prometheus.Registry
	// MaxQueue caps generation requests in flight (admitted, not finished);
	// beyond it the server answers 429. 0 = no cap here (the engine may
	// still refuse with a queue-full error).
	MaxQueue int
	// MaxBodyBytes limits request bodies (413 beyond). 0 = 16 MiB.
	MaxBodyBytes int64
	// MaxN caps n (parallel completions per prompt). 0 = 16.
	MaxN int
	// MaxLogprobs caps logprobs / top_logprobs. 0 = 20 (OpenAI's limit).
	MaxLogprobs int
	// GrammarLimits bound compiling one response_format schema or forced
	// tool call (automaton states, memory, time); zero fields take the
	// grammar package's defaults.
	GrammarLimits grammar.Limits
	// ServedNames are aliases the model answers to besides
	// Backend.ModelName() (--served-model-name a,b,c). A request naming
	// any other model gets 404 model_not_found, as vLLM answers; an empty
	// or absent model field means the served model.
	ServedNames []string
	// AnyModel accepts any model name (the served model answers).
	AnyModel bool
	// Version is reported by GET /version and folded into
	// system_fingerprint.
	Version string
	// Logger receives request errors and drain notices. nil = discard.
	Logger *slog.Logger

	// MaxWaiting is the engine's waiting-queue cap (requests; one per
	// prompt). A request with more prompts than this could never be
	// queued, so it gets 400 rather than a 429 it can never pass. 0 = no
	// check here.
	MaxWaiting int
	// MaxConnections caps open client connections; further connections
	// wait in the kernel's accept queue. 0 = 2048.
	MaxConnections int
	// ReadHeaderTimeout bounds reading a request's headers. 0 = 30s.
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body (408 beyond). It
	// is lifted once the body is in, so generation time does not count.
	// 0 = 60s.
	BodyReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long. 0 = 120s.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write to the client, renewed per write, so
	// a stream that makes progress is never cut but a client that stops
	// reading is. 0 = 60s.
	WriteTimeout time.Duration
	// AllowedOrigins get CORS headers (and preflight answers); "*" allows
	// any origin. Empty: no CORS, so browsers keep other sites out.
	AllowedOrigins []string
	// AllowedHosts are Host header names accepted besides localhost,
	// 127.0.0.1 and [::1] when the server listens on loopback only (DNS
	// rebinding protection); "*" turns the check off.
	AllowedHosts []string
	// Engine feeds the web page's engine view (GET /api/engine, behind the
	// API key). nil: the endpoint answers 404 and the page shows the chat
	// only.
	Engine EngineViewer
	// Embedder serves /v1/embeddings, /api/embed and /api/embeddings
	// (server/embed.go). nil: they answer 400.
	Embedder Embedder
	// KVEvents is the engine's KV event log (engine.Config.KVEvents),
	// streamed at GET /v1/kv_events (server/kvevents.go). nil: 404.
	KVEvents *kvcache.EventLog
	// Health says why the backend cannot serve now (nil: it can), e.g.
	// its worker group is down: GET /health then answers 503 with the
	// reason in a JSON body, and new generation requests 503 with it. An
	// error with a HealthDetails() map[string]any method adds those
	// fields to the /health body. nil: always healthy.
	Health func() error
}

// Server serves the OpenAI-compatible API over a Backend.
type Server struct {
	b       Backend
	o       Options
	created int64
	fp      string
	log     *slog.Logger
	mux     *http.ServeMux

	inflight atomic.Int64 // admitted generation requests
	draining atomic.Bool
	cut      atomic.Bool // drain grace ran out: remaining requests are being cancelled
	loopback atomic.Bool // listening on loopback only: check Host headers
	abort    chan struct{}
	abortMu  sync.Once
	consOnce sync.Once
	cons     *grammar.Cache // compiled constraints, when the backend shares none

	httpReqs *prometheus.CounterVec
	httpDur  *prometheus.HistogramVec
	httpLive prometheus.Gauge
}

// New builds a Server over b.
func New(b Backend, o Options) *Server {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 16 << 20
	}
	if o.MaxN <= 0 {
		o.MaxN = 16
	}
	if o.MaxLogprobs <= 0 {
		o.MaxLogprobs = 20
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	o.setTimeouts()
	s := &Server{b: b, o: o, created: time.Now().Unix(), log: o.Logger, abort: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h := sha256.Sum256([]byte(b.ModelName() + "\x00" + o.Version))
	s.fp = "fp_" + hex.EncodeToString(h[:5])
	s.registerMetrics()

	m := http.NewServeMux()
	gen := completionsAPI{s}
	m.HandleFunc("POST /v1/completions", s.auth(gen.handleCompletions))
	m.HandleFunc("POST /v1/chat/completions", s.auth(gen.handleChat))
	models, tok := modelsAPI{s}, tokenizeAPI{s}
	m.HandleFunc("GET /v1/models", s.auth(models.handleModels))
	m.HandleFunc("GET /v1/models/{id...}", s.auth(models.handleModel))
	m.HandleFunc("POST /tokenize", s.auth(tok.handleTokenize))
	m.HandleFunc("POST /detokenize", s.auth(tok.handleDetokenize))
	m.HandleFunc("GET /health", models.handleHealth)
	m.HandleFunc("GET /version", infoAuth(s, models.handleVersion))
	if o.Registry != nil {
		m.HandleFunc("GET /metrics", infoAuth(s, promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{}).ServeHTTP))
	}
	webAPI{s}.registerWeb(m)
	embedAPI{s}.registerEmbed(m)
	ollamaAPI{s}.registerOllama(m)
	anthropicAPI{s}.registerAnthropic(m)
	kvEventsAPI{s}.registerKVEvents(m)
	m.HandleFunc("/", gate{s}.noRoute)
	s.mux = m
	return s
}

// Handler returns the HTTP handler with body limits, metrics and the
// Host/CORS/Content-Type screening applied. The Host check and the
// connection deadlines and cap take effect only under Serve.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK, rc: http.NewResponseController(w), wt: s.o.WriteTimeout}
		if s.httpLive != nil {
			s.httpLive.Inc()
			defer s.httpLive.Dec()
		}
		if (gate{s}).screen(rec, r) {
			s.mux.ServeHTTP(rec, r)
		}
		if rec.status >= 500 {
			s.log.Warn("server: request failed", "method", r.Method, "path", r.URL.Path, "status", rec.status)
		}
		if s.httpReqs != nil {
			path := metricPath(r.URL.Path)
			s.httpReqs.WithLabelValues(path, strconv.Itoa(rec.status)).Inc()
			s.httpDur.WithLabelValues(path).Observe(time.Since(start).Seconds())
		}
	})
}

// ListenAndServe serves on addr until ctx is cancelled, then stops
// accepting, lets in-flight requests finish for up to grace (new requests
// on open connections get 503), cancels whatever is left and returns nil.
func (s *Server) ListenAndServe(ctx context.Context, addr string, grace time.Duration) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server: listen %s: %w", addr, err)
	}
	return s.Serve(ctx, ln, grace)
}

// Serve is ListenAndServe on an existing listener, which it closes.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	baseCtx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	s.loopback.Store(isLoopback(ln.Addr()))
	ln = newLimitListener(ln, s.o.MaxConnections)
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.o.ReadHeaderTimeout,
		IdleTimeout:       s.o.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("server: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("server: draining", "in_flight", s.inflight.Load(), "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	go func() {
		select {
		case <-s.abort:
			cancel()
		case <-sctx.Done():
		}
	}()
	if err := hs.Shutdown(sctx); err != nil {
		// Grace ran out (or Abort): cancel the remaining requests so the
		// engine frees their KV blocks, give their handlers a moment to
		// answer 503, then drop the connections.
		s.log.Warn("server: drain grace expired, cancelling", "in_flight", s.inflight.Load())
		s.cut.Store(true)
		cancelAll()
		cctx, ccancel := context.WithTimeout(context.Background(), cutAnswerTime)
		_ = hs.Shutdown(cctx)
		ccancel()
		_ = hs.Close()
	}
	<-errc
	return nil
}

// cutAnswerTime is how long requests cancelled at the drain deadline get
// to write their 503 before the connections are closed.
const cutAnswerTime = time.Second

// Abort ends a drain at once: the requests still running are cancelled
// (they answer 503) instead of being given the rest of the grace period.
// Before a drain has begun it only marks that one should not wait.
func (s *Server) Abort() { s.abortMu.Do(func() { close(s.abort) }) }

// cutError is the answer for a request whose context ended because the
// drain deadline passed, or nil when the context ended for another reason
// (the client left).
func (s *Server) cutError() *apiError {
	if !s.cut.Load() {
		return nil
	}
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
		Message: "server shut down before the request finished"}
}

// admit counts a generation request in; false means the server is full or
// draining and the caller has already answered.
func (s *Server) admit(w http.ResponseWriter) bool {
	if ae := admission(s); ae != nil {
		writeAPIError(w, ae)
		return false
	}
	return true
}

// admission counts a generation request in, or says why it may not start
// (the server is draining or full) for the caller to answer in its API's
// shape. A function, not a method: Server's method set is capped.
func admission(s *Server) *apiError {
	if s.draining.Load() {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Message: "server is shutting down"}
	}
	if ae := unhealthy(s.o.Health); ae != nil {
		return ae
	}
	n := s.inflight.Add(1)
	if s.o.MaxQueue > 0 && n > int64(s.o.MaxQueue) {
		s.inflight.Add(-1)
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error",
			Code: "rate_limit_exceeded", Message: fmt.Sprintf("server busy: %d requests in flight (limit %d)", n-1, s.o.MaxQueue)}
	}
	return nil
}

func (s *Server) release() { s.inflight.Add(-1) }

func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.o.APIKey == "" {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.keyOK(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pagoda"`)
			writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
				Code: "invalid_api_key", Message: "missing or incorrect API key (Authorization: Bearer <key>, or x-api-key: <key>)"})
			return
		}
		h(w, r)
	}
}

// infoAuth guards the informational endpoints (/metrics, /version):
// open, as in vLLM, unless Options.MetricsAuth asks for the API key there
// too. A function, not a method: Server's method set is capped.
func infoAuth(s *Server, h http.HandlerFunc) http.HandlerFunc {
	if !s.o.MetricsAuth {
		return h
	}
	return s.auth(h)
}

// keyOK checks the API key: "Authorization: Bearer <key>" (OpenAI,
// ollama) or "x-api-key: <key>" (Anthropic).
func (s *Server) keyOK(r *http.Request) bool {
	want := []byte(s.o.APIKey)
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(k)), want) == 1
	}
	// RFC 7235: the scheme name is case-insensitive.
	scheme, tok, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	got := []byte(strings.TrimSpace(tok))
	return strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare(got, want) == 1
}

func (s modelsAPI) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if s.o.Health != nil {
		if err := s.o.Health(); err != nil {
			writeUnhealthy(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s modelsAPI) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]string{"version": s.o.Version})
}

func (s modelsAPI) modelObject(id string) map[string]any {
	return map[string]any{
		"id": id, "object": "model", "created": s.created,
		"owned_by": "pagoda", "root": s.b.ModelName(), "parent": nil,
		"max_model_len": s.b.ContextLen(),
	}
}

func (s modelsAPI) handleModels(w http.ResponseWriter, r *http.Request) {
	var data []any
	for _, n := range s.servedNames() {
		data = append(data, s.modelObject(n))
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (s modelsAPI) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.serves(id) {
		writeAPIError(w, modelNotFound(id))
		return
	}
	writeJSON(w, s.modelObject(id))
}

func modelNotFound(name string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
		Code: "model_not_found", Message: fmt.Sprintf("the model %q does not exist", name)}
}

func (s *Server) checkModel(name string) *apiError {
	if s.o.AnyModel || name == "" || s.serves(name) {
		return nil
	}
	return modelNotFound(name)
}

// serves says whether name is the model or an alias; ollama clients add
// the ":latest" tag to a bare name, so that tag is ignored.
func (s *Server) serves(name string) bool {
	base, tag, ok := strings.Cut(name, ":")
	for _, n := range s.servedNames() {
		if name == n || (ok && tag == "latest" && base == n) {
			return true
		}
	}
	return false
}

// servedNames is the model's name then its aliases.
func (s *Server) servedNames() []string {
	names := []string{s.b.ModelName()}
	for _, n := range s.o.ServedNames {
		if n != "" && n != names[0] {
			names = append(names, n)
		}
	}
	return names
}

// marshal is json.Marshal without HTML escaping: token text such as "<s>"
// should read as itself.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := marshal(v)
	if err != nil {
		writeAPIError(w, &apiError{Status: 500, Type: "server_error", Message: "encoding response: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// decodeBody reads one JSON object into v, mapping the failure modes to
// OpenAI-shaped 400/413 errors.
func decodeBody(r *http.Request, v any) *apiError {
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &mbe):
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		case errors.As(err, &ute):
			return typeError(ute)
		case errors.As(err, &se):
			return badRequest("", "malformed JSON body at offset %d: %v", se.Offset, err)
		case errors.Is(err, io.EOF):
			return badRequest("", "empty request body; expected a JSON object")
		default:
			return badRequest("", "malformed JSON body: %v", err)
		}
	}
	if dec.More() {
		return badRequest("", "malformed JSON body: trailing data after the object")
	}
	return nil
}

func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// statusRecorder notes the status for metrics and renews the write
// deadline before every write, so a stream that keeps going is never cut
// while a client that stops reading is.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	rc     *http.ResponseController
	wt     time.Duration
}

func (r *statusRecorder) renew() {
	if r.wt > 0 {
		_ = r.rc.SetWriteDeadline(time.Now().Add(r.wt))
	}
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.renew()
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	r.renew()
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func metricPath(p string) string {
	switch p {
	case "/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
		"/health", "/version", "/metrics", "/api/engine", "/v1/kv_events", "/":
		return p
	}
	if strings.HasPrefix(p, "/static/") {
		return "/static/{file}"
	}
	if strings.HasPrefix(p, "/v1/models/") {
		return "/v1/models/{id}"
	}
	return "other"
}

var registerMu sync.Mutex

// registerMetrics adds the server's HTTP metrics to the registry. The
// engine owns the vllm:* request metrics; a name that is already taken is
// reused, so two servers may share one registry.
func (s *Server) registerMetrics() {
	reg := s.o.Registry
	if reg == nil {
		return
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	s.httpReqs = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagoda:http_requests_total", Help: "HTTP requests by path and status code.",
	}, []string{"path", "code"}))
	s.httpDur = register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pagoda:http_request_duration_seconds", Help: "HTTP request duration (until the handler returns, streams included).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"path"}))
	s.httpLive = register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pagoda:http_requests_in_flight", Help: "HTTP requests being served.",
	}))
	if s.httpReqs == nil || s.httpDur == nil {
		s.httpReqs, s.httpDur = nil, nil
	}
}

func register[C prometheus.Collector](reg *prometheus.Registry, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if ex, ok := are.ExistingCollector.(C); ok {
				return ex
			}
		}
		var zero C
		return zero
	}
	return c
}

// The route groups: each API surface's handlers hang off its own type so
// that Server keeps only what every surface shares.
type (
	ollamaAPI    struct{ *Server }
	anthropicAPI struct{ *Server }
	embedAPI     struct{ *Server }
	tokenizeAPI  struct{ *Server }
	webAPI       struct{ *Server }
	modelsAPI    struct{ *Server }
	kvEventsAPI  struct{ *Server }
	// completionsAPI is OpenAI's generation: /v1/completions and
	// /v1/chat/completions.
	completionsAPI struct{ *Server }
)
