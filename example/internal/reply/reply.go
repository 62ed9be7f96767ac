// Package reply writes the shop's JSON answers and its RFC 9457 problems,
// for the shop's handlers and the bank's alike.
package reply

import (
	"encoding/json"
	"net/http"
)

// JSON answers v as JSON with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// Problem answers an RFC 9457 problem whose type is /problems/slug.
func Problem(w http.ResponseWriter, status int, slug, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"type": "/problems/" + slug, "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
