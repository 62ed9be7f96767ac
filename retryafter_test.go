package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// Retry-After says when the answer can differ. While the key's owner
// holds its lock, that is any moment: one lease, the pace at which to ask.
// Once its lock lapsed (its process crashed, or stalls), the answer changes
// at the claim horizon, when the key reads interrupted, unless the owner
// stores first: a client told "in one lease" would ask a dozen times in
// vain.
func TestRetryAfterACrashedOwnerIsTheTimeLeftToTheHorizon(t *testing.T) {
	s := newShop(t, WithLockLease(200*time.Millisecond), WithWaitTimeout(300*time.Millisecond))
	horizon := s.idem.cfg.claimHorizon()
	ctx := t.Context()
	c := s.client()
	k := crashedOwner(t, s, c, "k")

	retryAfter := func() time.Duration {
		a := s.post(c, "/payments", "k", `{}`)
		requireProblem(t, a, http.StatusConflict, "in-progress")
		secs, err := strconv.Atoi(a.header.Get("Retry-After"))
		require.NoError(t, err)
		return time.Duration(secs) * time.Second
	}
	got := retryAfter()
	require.Greater(t, got, horizon-10*time.Second, "a crashed owner's key is told the horizon, not a lease")
	require.LessOrEqual(t, got, horizon+time.Second)

	require.NoError(t, redistest.Age(ctx, s.rdb, k.record, horizon-5*time.Second))
	got = retryAfter()
	require.LessOrEqual(t, got, 5*time.Second, "the time left, not the whole horizon")

	require.NoError(t, redistest.Age(ctx, s.rdb, k.record, 6*time.Second))
	requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "interrupted")
	require.EqualValues(t, 1, s.execs.Load(), "only the probe ran")
}

// A request that waits behind another of its key in the same process is
// told what that one is told. Its wait may end a moment before its
// leader's, while the leader still asks Redis (here, a slow Redis): it
// too is told the time left to the horizon, not one lease in which
// nothing can change. So is either of them when an outer timeout (a
// router's, shorter than the wait) ends the wait first.
func TestRetryAfterOfAFollowerIsItsLeaders(t *testing.T) {
	for _, outer := range []time.Duration{0, 400 * time.Millisecond} {
		t.Run(fmt.Sprintf("outer timeout %v", outer), func(t *testing.T) {
			srv := redistest.Private(t)
			proxy := redistest.NewProxy(t, srv.Addr())
			s := newShopOn(t, clientTo(t, proxy.Addr()), WithKeyPrefix("follower-retry-after"),
				WithLockLease(200*time.Millisecond), WithWaitTimeout(600*time.Millisecond), WithResponseCache(0, 0))
			horizon := s.idem.cfg.claimHorizon()
			c := s.client()
			crashedOwner(t, s, c, "k")
			if outer > 0 {
				// The same route on a server of its own, behind a timeout
				// that ends the request's context before its wait ends.
				routed := s.idem.ProtectKey(http.HandlerFunc(s.count))
				timed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ctx, cancel := context.WithTimeout(r.Context(), outer)
					defer cancel()
					routed.ServeHTTP(w, r.WithContext(ctx))
				}))
				t.Cleanup(timed.Close)
				s.srv = timed
			}

			// Each claim now takes 250 ms: the leader hears of the horizon
			// at +250 ms and +550 ms, and is refused at about +850 ms (+400
			// ms with the outer timeout); the follower, which joins at
			// once, is refused when its 600 ms wait ends (its 400 ms).
			proxy.SetDelay(250 * time.Millisecond)
			leader := s.postAsync(c, "/payments", "k", `{}`)
			require.Eventually(t, func() bool {
				s.idem.flights.mu.Lock()
				defer s.idem.flights.mu.Unlock()
				return len(s.idem.flights.m) == 1
			}, 5*time.Second, time.Millisecond, "the first request leads the key's flight")
			follower := s.postAsync(c, "/payments", "k", `{}`)

			for name, ch := range map[string]<-chan asyncAnswer{"leader": leader, "follower": follower} {
				a := (<-ch).must(t)
				requireProblem(t, a, http.StatusConflict, "in-progress")
				secs, err := strconv.Atoi(a.header.Get("Retry-After"))
				require.NoError(t, err)
				require.Greater(t, time.Duration(secs)*time.Second, horizon-10*time.Second,
					"the %s is told the horizon, not a lease", name)
			}
			require.EqualValues(t, 1, s.execs.Load(), "only the probe ran")
		})
	}
}

// crashedOwner claims the payment with key as c's request would, and lets
// the claim's lease run out, as the owner's crash would: its record stays
// claimed, nobody holds its lock. It returns the key's Redis keys.
func crashedOwner(t *testing.T, s *shop, c *http.Client, key string) keys {
	t.Helper()
	ctx := t.Context()
	k := clientKeys(s.idem.cfg.prefix, paymentID(key))
	lock, err := newTestLock()
	require.NoError(t, err)
	// The request's fingerprint, as the middleware makes it (the key is
	// not part of it), so that the claim below is the request's.
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", key+"-probe", `{}`).status)
	probe, err := redistest.ReadRecord(ctx, s.rdb, clientKeys(s.idem.cfg.prefix, paymentID(key+"-probe")).record)
	require.NoError(t, err)
	cl, err := s.idem.redis.claim(ctx, k, lock.Value(), probe.Fingerprint)
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, cl.outcome)
	require.NoError(t, s.rdb.Del(ctx, k.lock).Err())
	return k
}
