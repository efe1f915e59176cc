package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"pagoda/engine"
)

// The ollama API (docs/api.md in github.com/ollama/ollama) on the same
// server, so tools written for ollama can point at Pagoda: /api/chat,
// /api/generate, /api/tags, /api/show, /api/ps and /api/version. Options
// take ollama's names; answers and errors take its shapes ({"error": msg});
// streaming is NDJSON and on by default. keep_alive is accepted: the model
// stays loaded for the server's life.

// ModelInfo describes the served model for /api/show, /api/tags and
// /api/ps; the command fills it from the loaded model.
type ModelInfo struct {
	Family        string // architecture, e.g. "llama"
	Format        string // "gguf", "llama2c", "safetensors"
	Params        int64
	Quantization  string // e.g. "Q8_0", "F32"; "" unknown
	SizeBytes     int64  // the model file(s)
	KVBytes       int64  // the KV cache budget the server holds
	EmbeddingLen  int
	Layers        int
	Heads, KVHead int
	Loaded        time.Time
}

// ModelInfoer is optionally implemented by a Backend to describe its model.
type ModelInfoer interface {
	ModelInfo() ModelInfo
}

func (s ollamaAPI) registerOllama(m *http.ServeMux) {
	m.HandleFunc("POST /api/chat", s.auth(s.handleOllamaChat))
	m.HandleFunc("POST /api/generate", s.auth(s.handleOllamaGenerate))
	m.HandleFunc("GET /api/tags", s.auth(s.handleOllamaTags))
	m.HandleFunc("POST /api/show", s.auth(s.handleOllamaShow))
	m.HandleFunc("GET /api/ps", s.auth(s.handleOllamaPS))
	m.HandleFunc("GET /api/version", infoAuth(s.Server, s.handleOllamaVersion))
	// ollama's HEAD / answers "Ollama is running"; clients probe with it.
	m.HandleFunc("HEAD /{$}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
}

// ollamaOptions are the Modelfile parameters ollama takes in "options".
// Known ones are mapped; the rest of ollama's runner options (num_gpu,
// num_thread, mirostat, …) are accepted and have no effect here.
type ollamaOptions struct {
	NumPredict       *int            `json:"num_predict"`
	NumCtx           *int            `json:"num_ctx"`
	Temperature      *float64        `json:"temperature"`
	TopK             *int            `json:"top_k"`
	TopP             *float64        `json:"top_p"`
	MinP             *float64        `json:"min_p"`
	Seed             *int64          `json:"seed"`
	Stop             json.RawMessage `json:"stop"`
	RepeatPenalty    *float64        `json:"repeat_penalty"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type ollamaToolCall struct {
	Function ollamaFunction `json:"function"`
}

type ollamaFunction struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type ollamaChatRequest struct {
	Model     string            `json:"model"`
	Messages  []ollamaMessage   `json:"messages"`
	Tools     []json.RawMessage `json:"tools"`
	Format    json.RawMessage   `json:"format"`
	Options   *ollamaOptions    `json:"options"`
	Stream    *bool             `json:"stream"`
	KeepAlive json.RawMessage   `json:"keep_alive"`
	Think     json.RawMessage   `json:"think"`
}

type ollamaGenerateRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Suffix    string          `json:"suffix"`
	System    string          `json:"system"`
	Template  string          `json:"template"`
	Context   []int64         `json:"context"`
	Raw       bool            `json:"raw"`
	Images    []string        `json:"images"`
	Format    json.RawMessage `json:"format"`
	Options   *ollamaOptions  `json:"options"`
	Stream    *bool           `json:"stream"`
	KeepAlive json.RawMessage `json:"keep_alive"`
	Think     json.RawMessage `json:"think"`
}

// ollamaError writes ollama's error shape: {"error": "..."}.
func ollamaError(w http.ResponseWriter, ae *apiError) {
	w.Header().Set("Content-Type", "application/json")
	if ae.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(ae.Status)
	b, _ := marshal(map[string]string{"error": ae.Message})
	_, _ = w.Write(b)
}

// ollamaModel checks the model field: ollama requires it, and clients add
// the ":latest" tag to a bare name.
func (s ollamaAPI) ollamaModel(name string) *apiError {
	if name == "" {
		return badRequest("model", "model is required")
	}
	if ae := s.checkModel(name); ae != nil {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
			Message: fmt.Sprintf("model '%s' not found", name)}
	}
	return nil
}

// toCommon maps ollama's options onto the OpenAI-side parameters.
func (o *ollamaOptions) toCommon(p *commonParams) *apiError {
	if o == nil {
		return nil
	}
	p.Temperature, p.TopK, p.TopP, p.MinP, p.Seed = o.Temperature, o.TopK, o.TopP, o.MinP, o.Seed
	p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = o.RepeatPenalty, o.PresencePenalty, o.FrequencyPenalty
	p.Stop = o.Stop
	if o.TopK != nil && *o.TopK < 0 {
		z := 0 // ollama: a negative top_k is off
		p.TopK = &z
	}
	if o.NumPredict != nil {
		switch n := *o.NumPredict; {
		case n == -1 || n == -2: // -1 unlimited, -2 fill the context: up to the room left
		case n == 0:
			return badRequest("num_predict", "options.num_predict must be positive, -1 (no limit) or -2 (fill the context), got 0")
		case n < -2:
			return badRequest("num_predict", "options.num_predict must be positive, -1 (no limit) or -2 (fill the context), got %d", n)
		default:
			p.MaxTokens = &n
		}
	}
	if o.NumCtx != nil && *o.NumCtx < 0 {
		return badRequest("num_ctx", "options.num_ctx must be positive, got %d", *o.NumCtx)
	}
	return nil
}

// ollamaFormat maps format: "json" or a JSON schema object.
func ollamaFormat(raw json.RawMessage) (*responseFormat, *apiError) {
	t := strings.TrimSpace(string(raw))
	switch {
	case t == "" || t == "null" || t == `""`:
		return nil, nil
	case t == `"json"`:
		return &responseFormat{Type: "json_object"}, nil
	case strings.HasPrefix(t, "{"):
		return &responseFormat{Type: "json_schema", JSONSchema: &jsonSchemaSpec{Name: "format", Schema: raw}}, nil
	}
	return nil, badRequest("format", `format must be "json" or a JSON schema object, got %s`, t)
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

func (s ollamaAPI) ollamaChatRequest(req *ollamaChatRequest) (*chatRequest, *apiError) {
	if ae := s.ollamaModel(req.Model); ae != nil {
		return nil, ae
	}
	cr := &chatRequest{Tools: req.Tools}
	cr.Model = ""
	if ae := req.Options.toCommon(&cr.commonParams); ae != nil {
		return nil, ae
	}
	rf, ae := ollamaFormat(req.Format)
	if ae != nil {
		return nil, ae
	}
	cr.ResponseFormat = rf
	for i, m := range req.Messages {
		if len(m.Images) > 0 {
			return nil, badRequest("messages", "messages[%d].images: this server's models take text only", i)
		}
		in := chatMessageIn{Role: m.Role, Content: jsonString(m.Content), Name: m.ToolName}
		for _, tc := range m.ToolCalls {
			in.ToolCalls = append(in.ToolCalls, map[string]any{"type": "function",
				"function": map[string]any{"name": tc.Function.Name, "arguments": tc.Function.Arguments}})
		}
		cr.Messages = append(cr.Messages, in)
	}
	return cr, nil
}

func (s ollamaAPI) handleOllamaChat(w http.ResponseWriter, r *http.Request) {
	var req ollamaChatRequest
	if ae := decodeBody(r, &req); ae != nil {
		ollamaError(w, ae)
		return
	}
	cr, ae := s.ollamaChatRequest(&req)
	if ae != nil {
		ollamaError(w, ae)
		return
	}
	if len(cr.Messages) == 0 {
		// ollama loads the model and answers done with no message.
		writeJSON(w, ollamaDone{ollamaHead: s.ollamaHead(), Message: &ollamaMessage{Role: "assistant"}, Done: true, DoneReason: "load"})
		return
	}
	er, format, ae := s.prepareChat(r.Context(), cr)
	if ae != nil {
		ollamaError(w, ae)
		return
	}
	s.templateHeader(w)
	s.ollamaRun(w, r, er, format, req.Stream == nil || *req.Stream, true)
}

func (s ollamaAPI) handleOllamaGenerate(w http.ResponseWriter, r *http.Request) {
	var req ollamaGenerateRequest
	if ae := decodeBody(r, &req); ae != nil {
		ollamaError(w, ae)
		return
	}
	if ae := s.ollamaModel(req.Model); ae != nil {
		ollamaError(w, ae)
		return
	}
	switch {
	case len(req.Images) > 0:
		ollamaError(w, badRequest("images", "images: this server's models take text only"))
		return
	case req.Suffix != "":
		ollamaError(w, badRequest("suffix", "suffix (fill-in-the-middle) is not supported"))
		return
	case req.Template != "":
		ollamaError(w, badRequest("template", "template: a per-request Go template is not supported; the server's chat template applies (or use raw)"))
		return
	}
	if req.Prompt == "" && len(req.Context) == 0 {
		writeJSON(w, ollamaDone{ollamaHead: s.ollamaHead(), Response: new(string), Done: true, DoneReason: "load"})
		return
	}
	var er *engine.Request
	var ae *apiError
	format := toolNone
	if req.Raw || len(req.Context) > 0 {
		// raw: the prompt as it is; context: the token ids an earlier
		// answer returned, continued by the prompt as plain text.
		var p commonParams
		if ae = req.Options.toCommon(&p); ae != nil {
			ollamaError(w, ae)
			return
		}
		if er, ae = p.toEngine(s.limits()); ae != nil {
			ollamaError(w, ae)
			return
		}
		rf, ae := ollamaFormat(req.Format)
		if ae == nil {
			er.Constraint, ae = s.constraint(r.Context(), rf)
		}
		if ae != nil {
			ollamaError(w, ae)
			return
		}
		ids := make([]int32, 0, len(req.Context))
		for _, id := range req.Context {
			ids = append(ids, int32(id))
		}
		if ae = s.checkPromptIDs(ids, "context"); ae == nil {
			er.Prompt = append(ids, s.b.Tokenize(req.Prompt, len(ids) == 0)...)
			er.ID = newID("gen-")
			ae = s.setMaxTokens(er, &p, 0, "num_predict")
		}
		if ae == nil && len(er.Prompt) == 0 {
			ae = badRequest("prompt", "the prompt is empty")
		}
	} else {
		cr := &chatRequest{}
		if ae = req.Options.toCommon(&cr.commonParams); ae == nil {
			cr.ResponseFormat, ae = ollamaFormat(req.Format)
		}
		if ae == nil {
			if req.System != "" {
				cr.Messages = append(cr.Messages, chatMessageIn{Role: "system", Content: jsonString(req.System)})
			}
			cr.Messages = append(cr.Messages, chatMessageIn{Role: "user", Content: jsonString(req.Prompt)})
			er, format, ae = s.prepareChat(r.Context(), cr)
			s.templateHeader(w)
		}
	}
	if ae != nil {
		ollamaError(w, ae)
		return
	}
	s.ollamaRun(w, r, er, format, req.Stream == nil || *req.Stream, false)
}

type ollamaHead struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
}

func (s ollamaAPI) ollamaHead() ollamaHead {
	return ollamaHead{Model: s.b.ModelName(), CreatedAt: time.Now().UTC().Format(time.RFC3339Nano)}
}

type ollamaChunk struct {
	ollamaHead
	Message  *ollamaMessage `json:"message,omitempty"`
	Response *string        `json:"response,omitempty"`
	Done     bool           `json:"done"`
}

type ollamaDone struct {
	ollamaHead
	Message            *ollamaMessage `json:"message,omitempty"`
	Response           *string        `json:"response,omitempty"`
	Done               bool           `json:"done"`
	DoneReason         string         `json:"done_reason"`
	Context            []int32        `json:"context,omitempty"`
	TotalDuration      int64          `json:"total_duration"`
	LoadDuration       int64          `json:"load_duration"`
	PromptEvalCount    int            `json:"prompt_eval_count"`
	PromptEvalDuration int64          `json:"prompt_eval_duration"`
	EvalCount          int            `json:"eval_count"`
	EvalDuration       int64          `json:"eval_duration"`
}

// ollamaRun runs one generation and answers in ollama's shape: NDJSON
// chunks then a final one with the statistics, or that final one alone.
func (s ollamaAPI) ollamaRun(w http.ResponseWriter, r *http.Request, er *engine.Request, format toolFormat, stream, chat bool) {
	if ae := admission(s.Server); ae != nil {
		ollamaError(w, ae)
		return
	}
	defer s.release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var out *ndjson
	piece := func(text string) any {
		c := ollamaChunk{ollamaHead: s.ollamaHead()}
		if chat {
			c.Message = &ollamaMessage{Role: "assistant", Content: text}
		} else {
			c.Response = &text
		}
		return c
	}
	var onText func(string)
	if stream {
		onText = func(text string) {
			if out == nil {
				out = newNDJSON(w)
			}
			out.send(piece(text))
		}
	}
	res, ae := s.runTurn(ctx, cancel, er, format, onText)
	if ae != nil {
		if out != nil {
			out.send(map[string]string{"error": ae.Message})
		} else {
			ollamaError(w, ae)
		}
		return
	}
	if ctx.Err() != nil {
		return // the client left
	}
	d := ollamaDone{ollamaHead: s.ollamaHead(), Done: true, DoneReason: res.reason(),
		TotalDuration: res.total.Nanoseconds(), PromptEvalCount: res.usage.PromptTokens,
		PromptEvalDuration: res.promptDur.Nanoseconds(), EvalCount: res.usage.CompletionTokens,
		EvalDuration: (res.total - res.promptDur).Nanoseconds()}
	text := res.text
	if stream {
		text = "" // the text went out in the chunks
	}
	if chat {
		d.Message = &ollamaMessage{Role: "assistant", Content: text}
		for _, c := range res.calls {
			d.Message.ToolCalls = append(d.Message.ToolCalls, ollamaToolCall{Function: ollamaFunction{Name: c.Name, Arguments: argsObject(c.Arguments)}})
		}
	} else {
		d.Response = &text
		d.Context = append(append([]int32(nil), er.Prompt...), res.tokens...)
	}
	if out != nil {
		out.send(d)
		return
	}
	if stream {
		newNDJSON(w).send(d)
		return
	}
	writeJSON(w, d)
}

// argsObject is a tool call's arguments as the JSON object ollama sends
// (OpenAI's shape is a string holding it).
func argsObject(args string) json.RawMessage {
	raw := json.RawMessage(args)
	if json.Valid(raw) && strings.HasPrefix(strings.TrimSpace(args), "{") {
		return raw
	}
	return json.RawMessage("{}")
}

// ndjson writes newline-delimited JSON, one flushed object a line.
type ndjson struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	failed bool
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &ndjson{w: w, rc: http.NewResponseController(w)}
}

func (n *ndjson) send(v any) {
	if n.failed {
		return
	}
	b, err := marshal(v)
	if err != nil {
		b, _ = marshal(map[string]string{"error": "encoding: " + err.Error()})
	}
	if _, err := n.w.Write(append(b, '\n')); err != nil {
		n.failed = true
		return
	}
	if err := n.rc.Flush(); err != nil {
		n.failed = true
	}
}

func (s ollamaAPI) modelInfo() ModelInfo {
	var mi ModelInfo
	if m, ok := s.b.(ModelInfoer); ok {
		mi = m.ModelInfo()
	}
	if mi.Format == "" {
		mi.Format = "gguf"
	}
	if mi.Loaded.IsZero() {
		mi.Loaded = time.Unix(s.created, 0)
	}
	return mi
}

type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

func (mi ModelInfo) details() ollamaDetails {
	d := ollamaDetails{Format: mi.Format, Family: mi.Family, QuantizationLevel: mi.Quantization}
	if mi.Family != "" {
		d.Families = []string{mi.Family}
	}
	switch p := float64(mi.Params); {
	case p >= 1e9:
		d.ParameterSize = fmt.Sprintf("%.1fB", p/1e9)
	case p >= 1e6:
		d.ParameterSize = fmt.Sprintf("%.1fM", p/1e6)
	case p > 0:
		d.ParameterSize = fmt.Sprintf("%.0fK", p/1e3)
	}
	return d
}

// digest is a stable stand-in for ollama's blob digest: the name and
// the model's shape, hashed.
func (s ollamaAPI) digest(mi ModelInfo) string {
	return strings.TrimPrefix(s.fp, "fp_") + fmt.Sprintf("%012x", mi.SizeBytes)
}

func (s ollamaAPI) handleOllamaTags(w http.ResponseWriter, r *http.Request) {
	mi := s.modelInfo()
	var models []map[string]any
	for _, name := range s.servedNames() {
		models = append(models, map[string]any{"name": name, "model": name,
			"modified_at": mi.Loaded.UTC().Format(time.RFC3339Nano), "size": mi.SizeBytes,
			"digest": s.digest(mi), "details": mi.details()})
	}
	writeJSON(w, map[string]any{"models": models})
}

func (s ollamaAPI) handleOllamaPS(w http.ResponseWriter, r *http.Request) {
	mi := s.modelInfo()
	name := s.b.ModelName()
	// keep_alive is not honoured by unloading: the model is held until the
	// server stops, which expires_at says by lying far in the future.
	writeJSON(w, map[string]any{"models": []any{map[string]any{"name": name, "model": name,
		"size": mi.SizeBytes + mi.KVBytes, "digest": s.digest(mi), "details": mi.details(),
		"expires_at": time.Now().Add(100 * 365 * 24 * time.Hour).UTC().Format(time.RFC3339), "size_vram": 0,
		"context_length": s.b.ContextLen()}}})
}

func (s ollamaAPI) handleOllamaShow(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model   string `json:"model"`
		Name    string `json:"name"` // the older field
		Verbose bool   `json:"verbose"`
	}
	if ae := decodeBody(r, &req); ae != nil {
		ollamaError(w, ae)
		return
	}
	if req.Model == "" {
		req.Model = req.Name
	}
	if ae := s.ollamaModel(req.Model); ae != nil {
		ollamaError(w, ae)
		return
	}
	mi := s.modelInfo()
	ct, _ := s.templateInfo()
	caps := []string{"completion"}
	if ts, ok := s.b.(ChatTemplateSourcer); ok && detectToolFormat(ts.ChatTemplateSource()) != toolNone {
		caps = append(caps, "tools")
	}
	arch := mi.Family
	info := map[string]any{"general.architecture": arch, "general.parameter_count": mi.Params}
	if arch != "" {
		info[arch+".context_length"] = s.b.ContextLen()
		info[arch+".embedding_length"] = mi.EmbeddingLen
		info[arch+".block_count"] = mi.Layers
		info[arch+".attention.head_count"] = mi.Heads
		info[arch+".attention.head_count_kv"] = mi.KVHead
	}
	params := ""
	for _, st := range ct.Stops {
		params += fmt.Sprintf("stop %q\n", st)
	}
	writeJSON(w, map[string]any{
		"modelfile":    fmt.Sprintf("# served by Pagoda\nFROM %s\n", s.b.ModelName()),
		"parameters":   strings.TrimSuffix(params, "\n"),
		"template":     ct.Source,
		"details":      mi.details(),
		"model_info":   info,
		"capabilities": caps,
		"modified_at":  mi.Loaded.UTC().Format(time.RFC3339Nano),
	})
}

func (s ollamaAPI) handleOllamaVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]string{"version": s.o.Version})
}

// SetModelInfo describes the model for /api/show, /api/tags and /api/ps.
func (b *EngineBackend) SetModelInfo(mi ModelInfo) { b.info = mi }

// ModelInfo is what SetModelInfo gave.
func (b *EngineBackend) ModelInfo() ModelInfo { return b.info }
