package idempotency

import (
	"net/http"
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
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	ctx := t.Context()
	lock, err := newTestLock()
	require.NoError(t, err)
	c := s.client()
	// The request's fingerprint, as the middleware makes it (the key is
	// not part of it), so that the claim below is this request's.
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "probe", `{}`).status)
	probe, err := redistest.ReadRecord(ctx, s.rdb, clientKeys(s.idem.cfg.prefix, paymentID("probe")).record)
	require.NoError(t, err)
	cl, err := s.idem.store.claim(ctx, k, lock.Token(), probe.Fingerprint)
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, cl.outcome)
	require.NoError(t, s.rdb.Del(ctx, k.lock).Err()) // the owner crashed; its lease ran out

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
