package optimistic

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetry(t *testing.T) {
	conflict := func(n int) error { return &ConflictError{Resource: "r", Expected: int64(n)} }
	other := errors.New("disk on fire")
	fast := Policy{Base: time.Microsecond, Cap: 10 * time.Microsecond}
	for _, tc := range []struct {
		name   string
		policy Policy
		script []error // what fn returns on each run; runs past the end return nil
		runs   int
		want   func(t *testing.T, err error)
	}{
		{name: "first run succeeds", policy: fast, runs: 1,
			want: func(t *testing.T, err error) { require.NoError(t, err) }},
		{name: "conflicts then success", policy: fast, script: []error{conflict(1), conflict(2)}, runs: 3,
			want: func(t *testing.T, err error) { require.NoError(t, err) }},
		{name: "other error stops at once", policy: fast, script: []error{conflict(1), other, conflict(3)}, runs: 2,
			want: func(t *testing.T, err error) { require.Equal(t, other, err) }},
		{name: "stale fence is not retried", policy: fast, script: []error{&StaleFenceError{}}, runs: 1,
			want: func(t *testing.T, err error) { require.ErrorIs(t, err, ErrStaleFence) }},
		{name: "missing row is retried", policy: fast,
			script: []error{&ConflictError{Missing: true}, other}, runs: 2,
			want: func(t *testing.T, err error) { require.Equal(t, other, err) }},
		{name: "attempts exhausted", policy: Policy{Attempts: 3, Base: time.Microsecond},
			script: []error{conflict(1), conflict(2), conflict(3), conflict(4)}, runs: 3,
			want: func(t *testing.T, err error) {
				require.ErrorIs(t, err, ErrConflict)
				var last *ConflictError
				require.ErrorAs(t, err, &last)
				require.EqualValues(t, 3, last.Expected, "the last conflict")
				require.ErrorContains(t, err, "gave up after 3 attempts")
			}},
		{name: "zero policy means ten attempts", policy: Policy{Base: time.Microsecond, Cap: time.Microsecond},
			script: repeat(conflict(0), 20), runs: 10,
			want: func(t *testing.T, err error) { require.ErrorIs(t, err, ErrConflict) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := 0
			err := Retry(t.Context(), tc.policy, func(ctx context.Context) error {
				runs++
				if runs <= len(tc.script) {
					return tc.script[runs-1]
				}
				return nil
			})
			tc.want(t, err)
			require.Equal(t, tc.runs, runs)
		})
	}
}

func repeat(err error, n int) []error {
	s := make([]error, n)
	for i := range s {
		s[i] = err
	}
	return s
}

func TestRetryHonoursContext(t *testing.T) {
	t.Run("cancelled during back-off", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		runs := 0
		start := time.Now()
		err := Retry(ctx, Policy{Base: time.Hour, Cap: time.Hour}, func(context.Context) error {
			runs++
			time.AfterFunc(10*time.Millisecond, cancel)
			return &ConflictError{Resource: "r", Expected: 1, Current: 2}
		})
		require.Less(t, time.Since(start), time.Second, "the back-off ends with the context")
		require.Equal(t, 1, runs)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, ErrConflict, "the conflict that made it wait is kept")
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		runs := 0
		err := Retry(ctx, Policy{Attempts: 1000, Base: time.Millisecond, Cap: 5 * time.Millisecond}, func(context.Context) error {
			runs++
			return &ConflictError{}
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Greater(t, runs, 1)
		require.Less(t, runs, 1000)
	})
	t.Run("ended before the first run", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := Retry(ctx, Policy{}, func(context.Context) error {
			t.Fatal("fn ran on an ended context")
			return nil
		})
		require.Equal(t, context.Canceled, err)
	})
	t.Run("cause is kept", func(t *testing.T) {
		lost := errors.New("lock lost")
		ctx, cancel := context.WithCancelCause(t.Context())
		cancel(lost)
		err := Retry(ctx, Policy{}, func(context.Context) error { return nil })
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, lost)
	})
}

func TestBackoff(t *testing.T) {
	p := Policy{}.withDefaults()
	require.Equal(t, Policy{Attempts: 10, Base: 2 * time.Millisecond, Cap: 200 * time.Millisecond}, p)
	for _, tc := range []struct {
		n       int
		ceiling time.Duration
	}{
		{1, 2 * time.Millisecond},
		{2, 4 * time.Millisecond},
		{4, 16 * time.Millisecond},
		{7, 128 * time.Millisecond},
		{8, 200 * time.Millisecond},
		{63, 200 * time.Millisecond},   // the shift would overflow
		{1000, 200 * time.Millisecond}, // and wrap
	} {
		t.Run(tc.ceiling.String(), func(t *testing.T) {
			var low, high bool
			for range 2000 {
				d := p.backoff(tc.n)
				require.GreaterOrEqual(t, d, time.Duration(0))
				require.LessOrEqual(t, d, tc.ceiling)
				low = low || d < tc.ceiling/4
				high = high || d > tc.ceiling*3/4
			}
			require.True(t, low && high, "full jitter spreads over the whole range")
		})
	}
}
