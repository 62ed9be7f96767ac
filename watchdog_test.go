package idempotency

import (
	"syscall"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/onceonly/idempotency/internal/redistest"
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
