package idempotency

import (
	"syscall"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A watchdog that cannot reach Redis reports the lease lost before the lock
// expires, so that the handler knows before another instance may take the
// key; and not much before.
func TestWatchdogReportsLossBeforeTheLockExpires(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	began := time.Now()
	lock, err := redislock.New(rdb).Obtain(t.Context(), "watchdog-test", 1500*time.Millisecond, nil)
	require.NoError(t, err)
	wd := startWatchdog(lock, 1500*time.Millisecond, time.Second, began, nil)
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

// A lapsed lock is taken back (retake.lua) only by the run its key's
// record names, and only while nobody holds the lock: a claim that holds
// it keeps it, and a run the record no longer names (resumed elsewhere, or
// settled by an operator) gets nothing back.
func TestALapsedLockIsRetakenOnlyByTheRunItsRecordNames(t *testing.T) {
	s := newShop(t)
	st := s.idem.store
	for _, tc := range []struct {
		name, owner, holder string
		taken               bool
		lockAfter           string
	}{
		{"the record names us, nobody holds the lock", "us", "", true, "us"},
		{"the record names us, we still hold the lock", "us", "us", true, "us"},
		{"the record names us, a claim holds the lock", "us", "them", false, "them"},
		{"the record names another run, nobody holds the lock", "them", "", false, ""},
		{"the record is gone", "", "", false, ""},
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
			taken, err := st.retake(ctx, k, "us")
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
