package server

import (
	"encoding/json"
	"errors"
	"net/http"
)

// healthDetails is an error that adds fields to /health's 503 body (a
// worker group's: the workers down and since when).
type healthDetails interface {
	error
	HealthDetails() map[string]any
}

// unhealthy is the answer for a generation request while health reports
// the backend down, or nil: 503 with the reason, so a client (or a load
// balancer) retries elsewhere or later rather than reading a 500.
func unhealthy(health func() error) *apiError {
	if health == nil {
		return nil
	}
	err := health()
	if err == nil {
		return nil
	}
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "unavailable", Message: err.Error()}
}

// writeUnhealthy answers /health with 503 and a JSON body saying why:
// {"status": "unavailable", "reason": …} and the error's details. (The
// healthy answer stays a bare 200, as before.)
func writeUnhealthy(w http.ResponseWriter, err error) {
	body := map[string]any{}
	if d, ok := errors.AsType[healthDetails](err); ok {
		for k, v := range d.HealthDetails() {
			body[k] = v
		}
	}
	body["status"], body["reason"] = "unavailable", err.Error()
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(b)
}
