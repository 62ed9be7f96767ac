package idempotency

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// WriteError answers as the middleware's own error handler does, inside a
// protected execution; DefaultErrorHandler outside one.
func TestWriteErrorUsesTheMiddlewaresHandler(t *testing.T) {
	custom := func(w http.ResponseWriter, _ *http.Request, err error) {
		w.Header().Set("X-Error-Handler", "custom")
		w.WriteHeader(StatusCode(err))
	}
	s := newShop(t, WithErrorHandler(custom))
	s.handler = func(w http.ResponseWriter, r *http.Request) { WriteError(w, r, ErrInProgress) }
	a := s.post(s.client(), "/payments", "k", `{}`)
	require.Equal(t, http.StatusConflict, a.status)
	require.Equal(t, "custom", a.header.Get("X-Error-Handler"))

	rec := httptest.NewRecorder()
	WriteError(rec, httptest.NewRequest(http.MethodPost, "/", nil), ErrInProgress)
	require.Equal(t, http.StatusConflict, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
}

// Every problem type the middleware answers has its anchor and its row in
// the README's problem table, with its status: the type URI a client gets
// leads to what it means and whether to retry.
func TestEveryProblemTypeHasItsREADMERow(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, p := range append(slices.Clone(problems), internalProblem) {
		row := fmt.Sprintf("| <a id=\"problem-%s\"></a>`%s` | %d | ", p.slug, p.slug, p.status)
		require.True(t, strings.Contains(string(readme), row), "the README has no row %q for %s", row, ProblemTypeBase+p.slug)
	}
}
