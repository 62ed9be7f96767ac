// Package shutdowntest tests the package-level Shutdown in a test binary
// of its own: it drains, and so closes, every Middleware of the process,
// which the root package's other tests share.
package shutdowntest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// A Middleware that a one-liner made, of which the program keeps no
// handle, is drained with every other one by the package's Shutdown: it
// waits for the call still running, and then refuses new ones.
func TestShutdownDrainsEveryMiddleware(t *testing.T) {
	const prefix = "shutdowntest"
	rdb := redistest.Client(t, prefix)
	started, finish := make(chan struct{}), make(chan struct{})
	pay := idempotency.ProtectKey(rdb, idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials())(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-finish
			w.WriteHeader(http.StatusCreated)
		}))
	post := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", nil)
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		pay.ServeHTTP(rec, req)
		return rec
	}
	first := make(chan int, 1)
	go func() { first <- post("k1").Code }()
	<-started

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, idempotency.Shutdown(ctx), context.DeadlineExceeded, "the call still runs: not drained")

	close(finish)
	require.Equal(t, http.StatusCreated, <-first)
	require.NoError(t, idempotency.Shutdown(t.Context()), "drained")
	require.Equal(t, http.StatusServiceUnavailable, post("k2").Code, "refused once drained")
}
