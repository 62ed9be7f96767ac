package idempotency

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A run that the middleware cut off (its execution timeout passed while
// its instance was away from Redis) starts no further step. Its key may
// already have been resumed elsewhere, and the step done and journaled
// there: a step the stale run starts late would do its effect a second
// time, and only fail at the journal.
func TestACutOffRunStartsNoStep(t *testing.T) {
	prefix := "test-" + t.Name()
	a, proxy := darkable(t, prefix, resumeTiming...)
	b := New(redistest.Client(t, prefix), append([]Option{WithKeyPrefix(prefix)}, resumeTiming...)...)
	var shipped atomic.Int64
	charged, goOn := make(chan struct{}), make(chan struct{})
	fn := chargeAndShip(&shipped, charged, goOn)
	first := startDo(a, fn(true))
	<-charged
	proxy.StartBlackhole() // the instance is away: its lock lapses, its run times out

	var o Outcome
	got, err := Do(context.Background(), b, Key{ID: "k"}, fn(false), Resumable(), ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Executed, o, "resumed")
	require.EqualValues(t, 1, got)

	proxy.EndBlackhole()
	close(goOn)
	require.ErrorIs(t, <-first, ErrExecutionTimeout)
	require.EqualValues(t, 1, shipped.Load(), "the resumed run shipped; the cut-off run must not ship again")
	again, err := Do(context.Background(), b, Key{ID: "k"}, fn(false), Resumable(), ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Replayed, o)
	require.Equal(t, got, again)
}

// chargeAndShip is a function of two steps, charge and ship, that counts
// its shipments. With stall it stops between the two, once it has closed
// charged, until goOn is closed: work that does not heed ctx, a slow
// synchronous call, or a process that was paused.
func chargeAndShip(shipped *atomic.Int64, charged, goOn chan struct{}) func(stall bool) func(context.Context) (int64, error) {
	return func(stall bool) func(context.Context) (int64, error) {
		return func(ctx context.Context) (int64, error) {
			if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return 0, err
			}
			if stall {
				close(charged)
				<-goOn
			}
			return Step(ctx, "ship", func(context.Context) (int64, error) { return shipped.Add(1), nil })
		}
	}
}

// startDo runs fn resumably under the key "k" on m, and returns its error
// once it ends.
func startDo(m *Middleware, fn func(context.Context) (int64, error)) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := Do(context.Background(), m, Key{ID: "k"}, fn, Resumable())
		done <- err
	}()
	return done
}

// A step started by a goroutine that outlives its run (a timeout handler
// inside the protection answered and went on; fire-and-forget work) does
// not run: the run's answer is settled, its journal closed, and a retry may
// already be running the step beside it.
func TestAStepAfterItsRunEndedDoesNotRun(t *testing.T) {
	m, _ := twoInstances(t)
	var ran atomic.Bool
	late := make(chan error, 1)
	_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
		go func() {
			time.Sleep(100 * time.Millisecond) // after Do returned
			_, err := Step(ctx, "notify", func(context.Context) (int, error) { ran.Store(true); return 1, nil })
			late <- err
		}()
		return 1, nil
	}, Resumable())
	require.NoError(t, err)
	require.Error(t, <-late)
	require.False(t, ran.Load(), "a step of a run that ended must not run")
}

// A resumable function cut off by the execution timeout after a step
// says so: Do's error wraps ErrExecutionTimeout, as it does without a
// step, not a bare context.DeadlineExceeded.
func TestACutOffAfterAStepSaysExecutionTimeout(t *testing.T) {
	m, _ := twoInstances(t, WithExecutionTimeout(300*time.Millisecond))
	_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
		if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}, Resumable())
	require.ErrorIs(t, err, ErrExecutionTimeout)
}
