package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// apiError is an error in OpenAI's JSON shape.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *apiError) Error() string { return e.Message }

func (e *apiError) MarshalJSON() ([]byte, error) {
	var param, code any
	if e.Param != "" {
		param = e.Param
	}
	if e.Code != "" {
		code = e.Code
	}
	return json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message,
		"type":    e.Type,
		"param":   param,
		"code":    code,
	}})
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...),
		Type: "invalid_request_error", Param: param}
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	b, _ := marshal(e)
	w.Header().Set("Content-Type", "application/json")
	if e.Status == http.StatusTooManyRequests {
		// Busy is transient: a slot frees as soon as any request finishes.
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

// writeErrorAt writes ae in the error shape of the API that path belongs
// to: a client of ollama or Anthropic parses only its own shape, so even
// the checks every request passes (Host, Content-Type, body size, auth,
// busy, shutting down) answer in it.
func writeErrorAt(w http.ResponseWriter, path string, ae *apiError) {
	switch {
	case strings.HasPrefix(path, "/api/"):
		ollamaError(w, ae)
	case path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/"):
		anthropicError(w, ae)
	default:
		writeAPIError(w, ae)
	}
}

// toAPIError maps an error from the backend to the status clients expect.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case isQueueFull(err):
		return &apiError{Status: http.StatusTooManyRequests, Message: err.Error(),
			Type: "rate_limit_error", Code: "rate_limit_exceeded"}
	case errors.Is(err, ErrTooLong):
		return &apiError{Status: http.StatusBadRequest, Message: err.Error(),
			Type: "invalid_request_error", Code: "context_length_exceeded"}
	case errors.Is(err, ErrBadInput):
		return &apiError{Status: http.StatusBadRequest, Message: err.Error(), Type: "invalid_request_error"}
	}
	var se StatusError
	if errors.As(err, &se) {
		typ := "server_error"
		if s := se.HTTPStatus(); s >= 400 && s < 500 {
			typ = "invalid_request_error"
		}
		return &apiError{Status: se.HTTPStatus(), Message: err.Error(), Type: typ}
	}
	return &apiError{Status: http.StatusInternalServerError, Message: err.Error(), Type: "server_error"}
}
