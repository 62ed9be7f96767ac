package idempotency

import (
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// A readiness probe follows Redis: ready while it answers, 503 while it is
// stopped, ready again once it is back.
func TestReadyFollowsRedis(t *testing.T) {
	srv := redistest.Private(t)
	m := New(srv.Client(t), WithStoreTimeout(200*time.Millisecond))
	probe := func() int {
		w := httptest.NewRecorder()
		m.ReadyHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return w.Code
	}
	require.Equal(t, http.StatusOK, probe())
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	require.Equal(t, http.StatusServiceUnavailable, probe())
	require.ErrorIs(t, m.Ready(t.Context()), ErrStoreUnavailable)
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return probe() == http.StatusOK }, 5*time.Second, 20*time.Millisecond)
}
