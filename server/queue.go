package server

import (
	"errors"
	"net/http"

	"pagoda/engine"
)

func isQueueFull(err error) bool {
	return errors.Is(err, ErrQueueFull) || errors.Is(err, engine.ErrQueueFull)
}

// submitError maps an error from Backend.Submit. Submit only validates and
// queues, so an error it does not name is taken as a problem with the
// request (400), unlike an error event mid-generation (500).
func submitError(err error) *apiError {
	if ae := kvPolicyError(err); ae != nil {
		return ae
	}
	switch {
	case errors.Is(err, engine.ErrTooLong):
		return &apiError{Status: http.StatusBadRequest, Message: err.Error(),
			Type: "invalid_request_error", Code: "context_length_exceeded"}
	case errors.Is(err, engine.ErrStopped):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"}
	}
	ae := toAPIError(err)
	if ae.Status == http.StatusInternalServerError {
		ae.Status, ae.Type = http.StatusBadRequest, "invalid_request_error"
	}
	return ae
}
