package idempotency

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A Redis that stops answering (SIGSTOP: connections stay open, replies
// never come) fails requests closed within the store timeout, never runs
// the handler, and serves again once it resumes.
func TestStalledRedisFailsClosedWithinStoreTimeout(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testStalledRedisFailsClosed(t, false) })
	// Batched: the pipeliner sends on a context of its own, and each
	// request stops waiting for its scripts at its own store timeout.
	t.Run("autopipeline", func(t *testing.T) { testStalledRedisFailsClosed(t, true) })
}

func testStalledRedisFailsClosed(t *testing.T, batched bool) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	const storeTimeout = 200 * time.Millisecond
	s := newShopOn(t, rdb, batchedIf(batched, WithStoreTimeout(storeTimeout))...)
	alwaysBatch(s.idem, batched)
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "before", `{}`).status)

	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	var slowest time.Duration
	for i := range 5 {
		start := time.Now()
		a := s.post(c, "/payments", "during-"+string(rune('a'+i)), `{}`)
		slowest = max(slowest, time.Since(start))
		requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
		require.Equal(t, "1", a.header.Get("Retry-After"))
	}
	require.EqualValues(t, 1, s.execs.Load(), "nothing ran while Redis was stalled")
	// go-redis's own ReadTimeout is 3 s: answering well inside it shows that
	// the store timeout, not the client's default, bounds a stalled step.
	require.Less(t, slowest, 3*time.Second)
	t.Logf("stalled Redis: slowest 503 after %v (store timeout %v)", slowest, storeTimeout)

	require.NoError(t, srv.Signal(syscall.SIGCONT))
	resumed = true
	require.Eventually(t, func() bool {
		return s.post(c, "/payments", "after", `{}`).status == http.StatusCreated
	}, 5*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 2, s.execs.Load())
}
