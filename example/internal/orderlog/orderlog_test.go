package orderlog

import (
	"context"
	"errors"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/stretchr/testify/require"
)

// A run whose write landed but which failed anyway (its reply was lost) is
// released, and the retry runs again: the event keeps the first run's
// entry, and the retry is one rerun however often it writes.
func TestEachEventIsRecordedOnce(t *testing.T) {
	eachLog(t, func(t *testing.T, mw *idempotency.Middleware, log *Log) {
		ctx := context.Background()
		ev := Event{Order: 7, Status: "paid"}
		key := idempotency.Key{Scope: "orders", ID: "order-7-paid"}
		replyLost := errors.New("i/o timeout")

		var first Effect
		_, err := idempotency.Do(ctx, mw, key, func(ctx context.Context) (Effect, error) {
			entry, rerun, err := log.Record(ctx, key.ID, ev)
			require.NoError(t, err)
			require.False(t, rerun)
			first = entry
			return entry, replyLost
		})
		require.ErrorIs(t, err, replyLost)
		_, err = idempotency.Do(ctx, mw, key, func(ctx context.Context) (Effect, error) {
			for range 2 {
				entry, rerun, err := log.Record(ctx, key.ID, ev)
				require.NoError(t, err)
				require.True(t, rerun)
				require.Equal(t, first.Fence, entry.Fence, "the entry is the first run's")
				require.Less(t, entry.Fence, idempotency.FencingToken(ctx))
			}
			return Effect{}, nil
		})
		require.NoError(t, err)

		effects, err := log.Effects(ctx)
		require.NoError(t, err)
		require.Len(t, effects, 1)
		reruns, err := log.Reruns(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, reruns)
	})
}

// An execution that writes its entry again (go-redis resends a command
// whose reply was lost) finds its own entry: no rerun.
func TestAnExecutionsOwnEntryIsNoRerun(t *testing.T) {
	eachLog(t, func(t *testing.T, mw *idempotency.Middleware, log *Log) {
		ctx := context.Background()
		_, err := idempotency.Do(ctx, mw, idempotency.Key{ID: "order-9"}, func(ctx context.Context) (Effect, error) {
			for range 2 {
				_, rerun, err := log.Record(ctx, "order-9", Event{Order: 9, Status: "paid"})
				require.NoError(t, err)
				require.False(t, rerun)
			}
			return Effect{}, nil
		})
		require.NoError(t, err)
		reruns, err := log.Reruns(ctx)
		require.NoError(t, err)
		require.Zero(t, reruns)
	})
}

// Two clients' equal keys are two events: the log names an event by its
// execution's record key, scope included.
func TestEqualKeysOfTwoScopesAreTwoEvents(t *testing.T) {
	eachLog(t, func(t *testing.T, mw *idempotency.Middleware, log *Log) {
		ctx := context.Background()
		for i, scope := range []string{"eu", "us"} {
			_, err := idempotency.Do(ctx, mw, idempotency.Key{Scope: scope, ID: "e1"}, func(ctx context.Context) (Effect, error) {
				entry, rerun, err := log.Record(ctx, "e1", Event{Order: int64(i + 1), Status: "paid"})
				require.False(t, rerun)
				return entry, err
			})
			require.NoError(t, err)
		}
		effects, err := log.Effects(ctx)
		require.NoError(t, err)
		require.Len(t, effects, 2)
	})
}

// The state of an event is fenced: an execution whose key was taken over
// cannot write it after the execution that took it over.
func TestStaleExecutionIsRefused(t *testing.T) {
	eachLog(t, func(t *testing.T, mw *idempotency.Middleware, log *Log) {
		ctx := context.Background()
		ev := Event{Order: 8, Status: "paid"}

		var stale context.Context
		release := errors.New("released")
		idempotency.Do(ctx, mw, idempotency.Key{ID: "order-8"}, func(ctx context.Context) (Effect, error) {
			stale = context.WithoutCancel(ctx) // keeps the first execution's fence
			return Effect{}, release
		})
		_, err := idempotency.Do(ctx, mw, idempotency.Key{ID: "order-8"}, func(ctx context.Context) (Effect, error) {
			entry, _, err := log.Record(ctx, "order-8", ev)
			return entry, err
		})
		require.NoError(t, err)
		_, _, err = log.Record(stale, "order-8", ev)
		require.ErrorIs(t, err, optimistic.ErrStaleFence)
	})
}

// eachLog runs fn on an order log and a middleware in Redis (a private
// server), and in each SQL database sqltest opens.
func eachLog(t *testing.T, fn func(t *testing.T, mw *idempotency.Middleware, log *Log)) {
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Private(t).Client(t)
		fn(t, idempotency.New(rdb), New(rdb, "orders", "test"))
	})
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		prefix := d.Table(t, "orders")
		t.Cleanup(func() {
			for _, table := range []string{"entries", "reruns", "states"} {
				d.Exec("DROP TABLE IF EXISTS " + prefix + "_" + table)
			}
		})
		log, err := NewSQL(t.Context(), d.DB, d.Dialect, prefix, "test")
		require.NoError(t, err)
		mw := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(d.Table(t, "keys")))
		fn(t, mw, log)
	})
}
