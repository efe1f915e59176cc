package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

func (o *Options) setTimeouts() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ReadHeaderTimeout, 30*time.Second)
	def(&o.BodyReadTimeout, 60*time.Second)
	def(&o.IdleTimeout, 120*time.Second)
	def(&o.WriteTimeout, 60*time.Second)
	if o.MaxConnections <= 0 {
		o.MaxConnections = 2048
	}
}

// gate is the way in ahead of the routes: the checks every request
// passes before routing and the answer when no route matches.
type gate struct{ *Server }

// screen applies the checks every request passes before routing: Host
// (DNS rebinding), CORS, Content-Type and the body read under its own
// deadline. false means it has answered.
func (s gate) screen(w *statusRecorder, r *http.Request) bool {
	if s.loopback.Load() && !s.o.hostAllowed(r.Host) {
		writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusForbidden, Type: "invalid_request_error",
			Message: fmt.Sprintf("Host %q is not allowed for a server on loopback (allow it with --allowed-hosts)", r.Host)})
		return false
	}
	origin := r.Header.Get("Origin")
	okOrigin := origin != "" && s.o.originAllowed(origin)
	if okOrigin {
		h := w.Header()
		h.Add("Vary", "Origin")
		if slices.Contains(s.o.AllowedOrigins, "*") {
			h.Set("Access-Control-Allow-Origin", "*")
		} else {
			h.Set("Access-Control-Allow-Origin", origin)
		}
	}
	if r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != "" {
		if !okOrigin {
			writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusForbidden, Type: "invalid_request_error",
				Message: fmt.Sprintf("origin %q is not allowed (see --allowed-origins)", origin)})
			return false
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return false
	}
	if r.Method != http.MethodPost {
		return true
	}
	if _, pat := s.mux.Handler(r); pat == "/" {
		return true // no such POST route: 404/405 from the mux
	}
	// A browser sends text/plain or a form cross-origin without asking
	// first; insisting on JSON forces a CORS preflight the server refuses
	// unless the operator allowed the origin. ollama's documented curl
	// commands send no Content-Type (curl then says form-urlencoded), and
	// ollama takes them: its routes do too when no Origin says a browser
	// sent the request (browsers send Origin on every cross-origin POST).
	lenient := strings.HasPrefix(r.URL.Path, "/api/") && r.Header.Get("Origin") == ""
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); !lenient && (err != nil || mt != "application/json") {
		writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: fmt.Sprintf("Content-Type must be application/json, got %q", r.Header.Get("Content-Type"))})
		return false
	}
	return s.readBody(w, r)
}

// readBody reads the whole body under BodyReadTimeout and then lifts the
// read deadline: the server's background read that notices a vanished
// client must not time out during a long generation.
func (s gate) readBody(w *statusRecorder, r *http.Request) bool {
	_ = w.rc.SetReadDeadline(time.Now().Add(s.o.BodyReadTimeout))
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxBodyBytes))
	if err != nil {
		// Keep the expired deadline: the server would otherwise wait on
		// the rest of the body before closing the connection.
		_ = w.rc.SetReadDeadline(time.Now())
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)})
		case errors.As(err, &ne) && ne.Timeout():
			w.Header().Set("Connection", "close")
			writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body not received within %v", s.o.BodyReadTimeout)})
		default:
			w.Header().Set("Connection", "close")
			writeErrorAt(w, r.URL.Path, badRequest("", "reading request body: %v", err))
		}
		return false
	}
	_ = w.rc.SetReadDeadline(time.Time{})
	r.Body = io.NopCloser(bytes.NewReader(b))
	return true
}

func (o *Options) originAllowed(origin string) bool {
	for _, a := range o.AllowedOrigins {
		if a == "*" || strings.EqualFold(strings.TrimSuffix(a, "/"), origin) {
			return true
		}
	}
	return false
}

// hostAllowed accepts the loopback names (a page on another name that
// resolves to 127.0.0.1 is a DNS-rebinding attack) and the operator's.
func (o *Options) hostAllowed(host string) bool {
	if host == "" {
		return true // HTTP/1.0 without Host: not a browser
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	switch name {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	for _, a := range o.AllowedHosts {
		if a == "*" || strings.EqualFold(strings.Trim(a, "[]"), name) {
			return true
		}
	}
	return false
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// noRoute answers a request no route matched: 405 with Allow when the
// path exists under another method, 404 otherwise.
func (s gate) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pat := s.mux.Handler(probe); pat != "/" {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))})
		return
	}
	writeErrorAt(w, r.URL.Path, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
		Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path), Code: "not_found"})
}

// typeError words a JSON type mismatch in the API's terms: the field path
// as the client wrote it and a JSON type, never a Go type name.
func typeError(ute *json.UnmarshalTypeError) *apiError {
	field := strings.TrimPrefix(ute.Field, "commonParams.")
	if field == "" {
		return badRequest("", "the request body must be a JSON object, got JSON %s", ute.Value)
	}
	top, _, _ := strings.Cut(field, ".")
	return badRequest(top, "invalid type for %q: expected %s, got JSON %s", field, jsonKind(ute.Type), ute.Value)
}

func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	if t == reflect.TypeFor[json.RawMessage]() {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		e := jsonKind(t.Elem())
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(e, "an "), "a ") + "s"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Interface:
		return "a JSON value"
	}
	return "a different type"
}

// limitListener holds at most n connections open; Accept waits for a
// slot, so excess clients queue in the kernel instead of each holding a
// goroutine and a file descriptor here.
type limitListener struct {
	net.Listener
	sem   chan struct{}
	done  chan struct{}
	close sync.Once
}

func newLimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
