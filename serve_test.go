package idempotency

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every path to a stored answer checks the fingerprint: the cache, a
// request waiting in this process, one waiting on another instance, and
// Redis.
func TestEveryReplayPathChecksTheFingerprint(t *testing.T) {
	t.Run("cache", func(t *testing.T) {
		s := newShop(t)
		c := s.client()
		require.Equal(t, http.StatusCreated, s.post(c, "/payments", "fp", `{"a":1}`).status)
		requireProblem(t, s.post(c, "/payments", "fp", `{"a":2}`), 422, "key-reused")
	})
	t.Run("redis", func(t *testing.T) {
		s := newShop(t, WithResponseCache(0, 0))
		c := s.client()
		require.Equal(t, http.StatusCreated, s.post(c, "/payments", "fp", `{"a":1}`).status)
		requireProblem(t, s.post(c, "/payments", "fp", `{"a":2}`), 422, "key-reused")
	})
	slowFirst := func(t *testing.T, s *shop, dup *shop) answer {
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		defer free() // also when an assertion fails, so the server can close
		s.handler = func(w http.ResponseWriter, r *http.Request) { <-release; s.defaultHandler(w, r) }
		c := s.client()
		done := s.postAsync(c, "/payments", "fp", `{"a":1}`)
		require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
		began := time.Now()
		a := dup.post(c, "/payments", "fp", `{"a":2}`)
		require.Less(t, time.Since(began), time.Second, "refused at once, not after the wait")
		free()
		require.Equal(t, http.StatusCreated, (<-done).must(t).status)
		return a
	}
	t.Run("waiting in process", func(t *testing.T) {
		s := newShop(t)
		requireProblem(t, slowFirst(t, s, s), 422, "key-reused")
		require.EqualValues(t, 1, s.execs.Load())
	})
	t.Run("waiting on another instance", func(t *testing.T) {
		s := newShop(t)
		other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
		requireProblem(t, slowFirst(t, s, other), 422, "key-reused")
		require.EqualValues(t, 1, s.execs.Load()+other.execs.Load())
	})
}

// A request with another body under a key whose request runs in this very
// process is refused at once (422 key-reused), as Redis would refuse it,
// not made to follow the running request and wait for its end.
func TestAnotherBodyIsRefusedAtOnceWhileTheKeyRunsHere(t *testing.T) {
	s := newShop(t, WithWaitTimeout(10*time.Second))
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	s.handler = func(w http.ResponseWriter, r *http.Request) { <-release; s.defaultHandler(w, r) }
	c := s.client()
	first := s.postAsync(c, "/payments", "k", `{"amount":1}`)
	require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
	// A client that gives up long before the running request ends.
	impatient := *c
	impatient.Timeout = 5 * time.Second
	other := s.post(&impatient, "/payments", "k", `{"amount":2}`)
	requireProblem(t, other, http.StatusUnprocessableEntity, "key-reused")
	once.Do(func() { close(release) })
	require.Equal(t, http.StatusCreated, (<-first).status)
}
