package idempotency

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// pauseTiming leaves a paused run's context uncancelled: its execution
// timeout is far off, as the timers of a process that was stopped (SIGSTOP,
// a GC pause, a frozen VM) have not fired yet when it continues.
var pauseTiming = []Option{WithExecutionTimeout(30 * time.Second), WithLockLease(200 * time.Millisecond),
	WithStoreTimeout(100 * time.Millisecond), WithWaitTimeout(10 * time.Second)}

// An executor paused between two steps, whose run was taken over and
// finished meanwhile, starts no further step when it continues, although
// nothing in the process has cut its run off: before a step runs, Redis
// must still name the run, and hold its lock. The takeover is what Redis
// sees once a paused executor's lock lapsed and its claim horizon passed
// (aged here rather than waited for).
func TestAPausedExecutorStartsNoStepOfARunTakenOver(t *testing.T) {
	prefix := "test-" + t.Name()
	a, proxy := darkable(t, prefix, pauseTiming...)
	rdb := redistest.Client(t, prefix)
	b := New(rdb, append([]Option{WithKeyPrefix(prefix)}, pauseTiming...)...)
	var shipped atomic.Int64
	paused, goOn := make(chan struct{}), make(chan struct{})
	fn := chargeAndShip(&shipped, paused, goOn)
	first := startDo(a, fn(true))
	<-paused
	proxy.StartBlackhole() // stopped: it renews nothing
	k := functionKeys(b, "k")
	require.Eventually(t, func() bool { return rdb.Exists(t.Context(), k.lock).Val() == 0 },
		10*time.Second, 10*time.Millisecond, "the paused executor's lock lapses")
	require.NoError(t, redistest.Age(t.Context(), rdb, k.record, time.Hour))

	var o Outcome
	got, err := Do(context.Background(), b, Key{ID: "k"}, fn(false), Resumable(), ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Executed, o, "resumed")
	require.EqualValues(t, 1, got)

	proxy.EndBlackhole()
	close(goOn) // it continues
	// ErrLockLost, or ErrStoreUnavailable when a busy machine kept its
	// first commands after the outage from Redis: either way, not shipped.
	require.Error(t, <-first)
	require.EqualValues(t, 1, shipped.Load(), "the paused executor shipped again after the resumed run did")
}
