package idempotency

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// A browser's form submission that is refused gets a page a person can
// read, with the status, Retry-After and the advice to submit again; an
// API client, whatever else it accepts, gets problem+json.
func TestARefusedFormSubmissionGetsAPage(t *testing.T) {
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
	for _, tc := range []struct {
		accept string
		page   bool
	}{
		{browser, true},
		{"text/html", true},
		{"", false},
		{"*/*", false},
		{"application/json", false},
		{"application/problem+json, text/html;q=0.5", false},
	} {
		for _, err := range []error{retryAfter{ErrInProgress, 37_200_000_000}, ErrKeyReused, ErrStoreUnavailable, errOwnedElsewhere{ErrLockLost}} {
			r := httptest.NewRequest(http.MethodPost, "/orders", nil)
			if tc.accept != "" {
				r.Header.Set("Accept", tc.accept)
			}
			w := httptest.NewRecorder()
			DefaultErrorHandler(w, r, err)
			p := problemFor(err)
			require.Equal(t, p.status, w.Code)
			require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			require.Contains(t, w.Header().Values("Vary"), "Accept")
			if !tc.page {
				require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), tc.accept)
				require.JSONEq(t, string(p.body), w.Body.String())
				continue
			}
			require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"), tc.accept)
			body := w.Body.String()
			require.Contains(t, body, "<h1>"+p.title+"</h1>")
			require.Contains(t, body, ProblemTypeBase+p.slug)
			if after := w.Header().Get("Retry-After"); after == "1" {
				require.Contains(t, body, "Try again in 1 second:")
			} else if after != "" {
				require.Contains(t, body, "Try again in "+after+" seconds:")
			} else {
				require.NotContains(t, body, "Try again")
			}
		}
	}
	w := httptest.NewRecorder()
	DefaultErrorHandler(w, nil, ErrInProgress) // no request: problem+json
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
}
