package idempotency

import (
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A watchdog that cannot reach Redis reports the lease lost before the lock
// expires, so that the handler knows before another instance may take the
// key; and not much before.
func TestWatchdogReportsLossBeforeTheLockExpires(t *testing.T) {
	srv := redistest.Private(t)
	m := New(srv.Client(t), WithLockLease(1500*time.Millisecond))
	k := clientKeys(m.cfg.prefix, identityOf(false, "watchdog", "test"))
	began := time.Now()
	l := m.newLease(k, "fp", began)
	c, err := m.redis.claim(t.Context(), k, l.lockValue, "fp")
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, c.outcome)
	wd := startWatchdog(l, 1500*time.Millisecond, time.Second, began, false)
	defer wd.stop()
	lost := make(chan time.Duration, 1)
	wd.notify(func() { lost <- time.Since(began) })
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	defer srv.Signal(syscall.SIGCONT)
	select {
	case at := <-lost:
		require.Less(t, at, 1500*time.Millisecond, "before the lock expired")
		require.Greater(t, at, time.Second, "after the renewals could still land")
	case <-time.After(3 * time.Second):
		t.Fatal("the lost lease was never reported")
	}
}

// A lapsed lock is taken back (renew.lua) only by the run its key's record
// names, and only while nobody holds the lock and the lease may be taken
// back: a claim that holds it keeps it, and a run the record no longer
// names (resumed elsewhere, or settled by an operator) gets nothing back.
// A lock still ours is renewed either way.
func TestALapsedLockIsRetakenOnlyByTheRunItsRecordNames(t *testing.T) {
	s := newShop(t)
	st := s.idem.redis
	for _, tc := range []struct {
		name, owner, holder string
		retake, taken       bool
		lockAfter           string
	}{
		{"the record names us, nobody holds the lock", "us", "", true, true, "us"},
		{"the record names us, nobody holds the lock, renewal only", "us", "", false, false, ""},
		{"the record names us, we still hold the lock", "us", "us", true, true, "us"},
		{"the record names us, we still hold the lock, renewal only", "us", "us", false, true, "us"},
		{"the record names us, a claim holds the lock", "us", "them", true, false, "them"},
		{"the record names another run, nobody holds the lock", "them", "", true, false, ""},
		{"the record is gone", "", "", true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			k := clientKeys(s.idem.cfg.prefix, identityOf(false, "retake", tc.name))
			if tc.owner != "" {
				// A run's record: nine fields, the third its lock value.
				require.NoError(t, st.client.Set(ctx, k.record, "run fp "+tc.owner+" 1 1    \n", time.Minute).Err())
			}
			if tc.holder != "" {
				require.NoError(t, st.client.Set(ctx, k.lock, tc.holder, time.Minute).Err())
			}
			taken, err := st.renew(ctx, k, "us", tc.retake)
			require.NoError(t, err)
			require.Equal(t, tc.taken, taken)
			lock, err := st.client.Get(ctx, k.lock).Result()
			if tc.lockAfter == "" {
				require.ErrorIs(t, err, redis.Nil)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.lockAfter, lock)
			ttl := st.client.PTTL(ctx, k.lock).Val()
			require.Greater(t, ttl, time.Duration(0))
		})
	}
}
