package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"pagoda/engine"
	"pagoda/tokenizer"
)

// Embedder computes embeddings for the server (*engine.Embedder is one).
type Embedder interface {
	// Embed returns one pooled, unnormalized vector per input.
	Embed(ctx context.Context, inputs [][]int32) ([][]float32, error)
	// Dim is the vectors' width; ContextLen the most tokens an input may
	// have.
	Dim() int
	ContextLen() int
}

// maxEmbedInputs is OpenAI's cap on the inputs of one request.
const maxEmbedInputs = 2048

func (s embedAPI) registerEmbed(m *http.ServeMux) {
	m.HandleFunc("POST /v1/embeddings", s.auth(s.handleEmbeddings))
	m.HandleFunc("POST /api/embed", s.auth(s.handleOllamaEmbed))
	m.HandleFunc("POST /api/embeddings", s.auth(s.handleOllamaEmbeddings))
}

type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingsResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// noEmbeddings is the answer of a server whose model computes none.
func noEmbeddings() *apiError {
	return badRequest("model", "this server's model does not compute embeddings (its pooling type gives no sequence embedding)")
}

// parseEmbedInput reads OpenAI's input: a string, an array of strings, an
// array of token ids, or an array of arrays of token ids.
func (s embedAPI) parseEmbedInput(raw json.RawMessage) ([][]int32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "input is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return s.embedTexts([]string{one})
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("input", "input must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
	}
	if len(list) == 0 {
		return nil, badRequest("input", "input must not be an empty array")
	}
	if len(list) > maxEmbedInputs {
		return nil, badRequest("input", "input has %d items, at most %d are allowed", len(list), maxEmbedInputs)
	}
	first := bytes.TrimSpace(list[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		texts := make([]string, len(list))
		for i, r := range list {
			if err := json.Unmarshal(r, &texts[i]); err != nil {
				return nil, badRequest("input", "input[%d] must be a string like the others", i)
			}
		}
		return s.embedTexts(texts)
	case len(first) > 0 && first[0] == '[':
		out := make([][]int32, len(list))
		for i, r := range list {
			var raw []json.RawMessage
			if err := json.Unmarshal(r, &raw); err != nil {
				return nil, badRequest("input", "input[%d] must be an array of token ids like the others", i)
			}
			var ae *apiError
			if out[i], ae = s.embedIDs(raw, fmt.Sprintf("input[%d]", i)); ae != nil {
				return nil, ae
			}
		}
		return out, nil
	default:
		ids, ae := s.embedIDs(list, "input")
		if ae != nil {
			return nil, ae
		}
		return [][]int32{ids}, nil
	}
}

func (s embedAPI) embedTexts(texts []string) ([][]int32, *apiError) {
	out := make([][]int32, len(texts))
	for i, t := range texts {
		if t == "" {
			return nil, badRequest("input", "input[%d] is an empty string", i)
		}
		out[i] = s.b.Tokenize(t, true)
	}
	return out, nil
}

func (s embedAPI) embedIDs(list []json.RawMessage, where string) ([]int32, *apiError) {
	if len(list) == 0 {
		return nil, badRequest("input", "%s is an empty array of token ids", where)
	}
	ids, ae := parseIDs(list, where)
	if ae != nil {
		ae.Param = "input"
		return nil, ae
	}
	if vs, ok := s.b.(VocabSizer); ok {
		for _, id := range ids {
			if id < 0 || int(id) >= vs.VocabSize() {
				return nil, badRequest("input", "%s: token id %d out of range [0, %d)", where, id, vs.VocabSize())
			}
		}
	}
	return ids, nil
}

// checkLengths refuses inputs longer than the model's context (OpenAI's
// wording), or with truncate cuts them to it, keeping a closing special
// token (BERT's [SEP]) the tokenizer put last.
func (s embedAPI) checkLengths(inputs [][]int32, ctxLen int, truncate bool) *apiError {
	closing := int32(-1)
	if e := s.b.Tokenize("", true); len(e) > 0 {
		if p := s.b.Tokenize("x", true); len(p) > 1 && p[len(p)-1] == e[len(e)-1] && len(e) > 1 {
			closing = e[len(e)-1]
		}
	}
	for i, in := range inputs {
		if len(in) <= ctxLen {
			continue
		}
		if !truncate {
			return badRequest("input", "input[%d] has %d tokens; this model's maximum context length is %d tokens (shorten it, or let ollama's truncate cut it)", i, len(in), ctxLen)
		}
		last := in[len(in)-1]
		in = in[:ctxLen]
		if closing >= 0 && last == closing {
			in[ctxLen-1] = closing
		}
		inputs[i] = in
	}
	return nil
}

// finishEmbedding normalizes v to unit length, first keeping only its
// first dims values when dims > 0 (OpenAI's shortened embeddings).
func finishEmbedding(v []float32, dims int) []float32 {
	if dims > 0 && dims < len(v) {
		v = v[:dims]
	}
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss > 0 {
		inv := 1 / math.Sqrt(ss)
		for i := range v {
			v[i] = float32(float64(v[i]) * inv)
		}
	}
	return v
}

// embedBase64 is OpenAI's base64 encoding: the float32 values, little
// endian, base64 with padding.
func embedBase64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

func (s embedAPI) runEmbed(ctx context.Context, inputs [][]int32) ([][]float32, *apiError) {
	vecs, err := s.o.Embedder.Embed(ctx, inputs)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &apiError{Status: 499, Type: "invalid_request_error", Message: "request cancelled"}
		}
		return nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	}
	return vecs, nil
}

func (s embedAPI) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingsRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeAPIError(w, ae)
		return
	}
	if ae := s.checkModel(req.Model); ae != nil {
		writeAPIError(w, ae)
		return
	}
	e := s.o.Embedder
	if e == nil {
		writeAPIError(w, noEmbeddings())
		return
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		writeAPIError(w, badRequest("encoding_format", "encoding_format %q: want float or base64", req.EncodingFormat))
		return
	}
	dims := 0
	if req.Dimensions != nil {
		dims = *req.Dimensions
		if dims < 1 || dims > e.Dim() {
			writeAPIError(w, badRequest("dimensions", "dimensions %d: this model's embeddings have %d, so want 1 to %d", dims, e.Dim(), e.Dim()))
			return
		}
	}
	inputs, ae := s.parseEmbedInput(req.Input)
	if ae != nil {
		writeAPIError(w, ae)
		return
	}
	if ae := s.checkLengths(inputs, e.ContextLen(), false); ae != nil {
		writeAPIError(w, ae)
		return
	}
	vecs, ae := s.runEmbed(r.Context(), inputs)
	if ae != nil {
		writeAPIError(w, ae)
		return
	}
	resp := embeddingsResponse{Object: "list", Model: cmpOr(req.Model, s.b.ModelName()), Data: make([]embeddingData, len(vecs))}
	for i, v := range vecs {
		v = finishEmbedding(v, dims)
		d := embeddingData{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			d.Embedding = embedBase64(v)
		}
		resp.Data[i] = d
		resp.Usage.PromptTokens += len(inputs[i])
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	writeJSON(w, resp)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ollama's /api/embed and the older /api/embeddings. Errors are ollama's
// {"error": "..."}.

type ollamaEmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Truncate   *bool           `json:"truncate"`
	Dimensions int             `json:"dimensions"`
	Options    map[string]any  `json:"options"`
	KeepAlive  any             `json:"keep_alive"`
}

type ollamaEmbedResponse struct {
	Model           string      `json:"model"`
	Embeddings      [][]float32 `json:"embeddings"`
	TotalDuration   int64       `json:"total_duration"`
	LoadDuration    int64       `json:"load_duration"`
	PromptEvalCount int         `json:"prompt_eval_count"`
}

func writeOllamaError(w http.ResponseWriter, ae *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.Status)
	b, _ := marshal(map[string]string{"error": ae.Message})
	_, _ = w.Write(b)
}

// ollamaInputs reads ollama's input: a string or an array of strings.
func (s embedAPI) ollamaInputs(raw json.RawMessage) ([][]int32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "input is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return s.embedTexts([]string{one})
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("input", "input must be a string or an array of strings")
	}
	if len(list) == 0 {
		return nil, badRequest("input", "input must not be an empty array")
	}
	if len(list) > maxEmbedInputs {
		return nil, badRequest("input", "input has %d items, at most %d are allowed", len(list), maxEmbedInputs)
	}
	return s.embedTexts(list)
}

// ollamaContext is the context an ollama request asks for (options.num_ctx),
// within the model's.
func ollamaContext(opts map[string]any, model int) (int, *apiError) {
	v, ok := opts["num_ctx"]
	if !ok {
		return model, nil
	}
	f, ok := v.(float64)
	if !ok || f < 1 || f != math.Trunc(f) {
		return 0, badRequest("options.num_ctx", "options.num_ctx must be a positive integer")
	}
	return min(int(f), model), nil
}

func (s embedAPI) handleOllamaEmbed(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var req ollamaEmbedRequest
	if ae := decodeBody(r, &req); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	if ae := s.checkModel(req.Model); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	e := s.o.Embedder
	if e == nil {
		writeOllamaError(w, noEmbeddings())
		return
	}
	if req.Dimensions < 0 || req.Dimensions > e.Dim() {
		writeOllamaError(w, badRequest("dimensions", "dimensions %d: this model's embeddings have %d", req.Dimensions, e.Dim()))
		return
	}
	ctxLen, ae := ollamaContext(req.Options, e.ContextLen())
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	inputs, ae := s.ollamaInputs(req.Input)
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	truncate := req.Truncate == nil || *req.Truncate
	if ae := s.checkLengths(inputs, ctxLen, truncate); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	vecs, ae := s.runEmbed(r.Context(), inputs)
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	resp := ollamaEmbedResponse{Model: cmpOr(req.Model, s.b.ModelName()), Embeddings: make([][]float32, len(vecs))}
	for i, v := range vecs {
		resp.Embeddings[i] = finishEmbedding(v, req.Dimensions)
		resp.PromptEvalCount += len(inputs[i])
	}
	resp.TotalDuration = time.Since(start).Nanoseconds()
	writeJSON(w, resp)
}

// handleOllamaEmbeddings is ollama's deprecated /api/embeddings: one
// prompt, and, as ollama returns it, the vector unnormalized.
func (s embedAPI) handleOllamaEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string         `json:"model"`
		Prompt    *string        `json:"prompt"`
		Options   map[string]any `json:"options"`
		KeepAlive any            `json:"keep_alive"`
	}
	if ae := decodeBody(r, &req); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	if ae := s.checkModel(req.Model); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	e := s.o.Embedder
	if e == nil {
		writeOllamaError(w, noEmbeddings())
		return
	}
	if req.Prompt == nil {
		writeOllamaError(w, badRequest("prompt", "prompt is required"))
		return
	}
	if *req.Prompt == "" {
		// ollama answers an empty prompt with an empty embedding.
		writeJSON(w, map[string]any{"embedding": []float32{}})
		return
	}
	inputs, ae := s.embedTexts([]string{*req.Prompt})
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	ctxLen, ae := ollamaContext(req.Options, e.ContextLen())
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	if ae := s.checkLengths(inputs, ctxLen, false); ae != nil {
		writeOllamaError(w, ae)
		return
	}
	vecs, ae := s.runEmbed(r.Context(), inputs)
	if ae != nil {
		writeOllamaError(w, ae)
		return
	}
	writeJSON(w, map[string]any{"embedding": vecs[0]})
}

// EmbeddingOnly is the Submitter of a server whose model is an encoder:
// every generation request gets a 400 naming the endpoints it does serve.
type EmbeddingOnly struct{ Name string }

func (e EmbeddingOnly) Submit(context.Context, *engine.Request) (<-chan engine.Event, error) {
	return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "model",
		Message: fmt.Sprintf("%s is an embedding model: it serves /v1/embeddings, /api/embed and /api/embeddings, not text generation", cmpOr(e.Name, "this model"))}
}

// embeddingBackend is the Backend of an encoder: an EngineBackend whose
// chat requests, like its completions, are refused as generation.
type embeddingBackend struct {
	*EngineBackend
	msg EmbeddingOnly
}

func (b embeddingBackend) ApplyChat([]ChatMessage, bool, map[string]any) (string, error) {
	_, err := b.msg.Submit(context.Background(), nil)
	return "", err
}

// NewEmbeddingBackend is the Backend of a server whose model is an
// encoder: tokenization for /tokenize and the embedding endpoints, and a
// 400 naming the embedding endpoints for every generation request.
func NewEmbeddingBackend(tok tokenizer.Tokenizer, name string, contextLen int) (Backend, error) {
	eo := EmbeddingOnly{Name: name}
	b, err := NewEngineBackend(eo, tok, name, contextLen, "")
	if err != nil {
		return nil, err
	}
	return embeddingBackend{b, eo}, nil
}
