package orderlog

import (
	"context"
	"errors"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/stretchr/testify/require"
)

// A run whose write landed but which failed anyway (its reply was lost) is
// released, and the retry runs again: the event keeps one entry, and the
// retry counts as a rerun. A write resent by the same execution is no
// rerun.
func TestEachEventIsRecordedOnce(t *testing.T) {
	rdb := redistest.Private(t).Client(t)
	mw := idempotency.New(rdb)
	log := New(rdb, "orders", "test")
	ctx := context.Background()
	ev := Event{Order: 7, Status: "paid"}
	key := idempotency.Key{Scope: "orders", ID: "order-7-paid"}
	replyLost := errors.New("i/o timeout")

	_, err := idempotency.Do(ctx, mw, key, func(ctx context.Context) (Effect, error) {
		_, err := log.Record(ctx, key.ID, ev)
		require.NoError(t, err)
		return Effect{}, replyLost
	})
	require.ErrorIs(t, err, replyLost)
	retried, err := idempotency.Do(ctx, mw, key, func(ctx context.Context) (Effect, error) {
		first, err := log.Record(ctx, key.ID, ev)
		require.NoError(t, err)
		_, err = log.Record(ctx, key.ID, ev) // the same execution again
		return first, err
	})
	require.NoError(t, err)

	effects, err := log.Effects(ctx)
	require.NoError(t, err)
	require.Len(t, effects, 1)
	require.Less(t, effects[0].Fence, retried.Fence, "the entry is the first run's")
	reruns, err := log.Reruns(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, reruns)
}

// The state of an event is fenced: an execution whose key was taken over
// cannot write it after the execution that took it over.
func TestStaleExecutionIsRefused(t *testing.T) {
	rdb := redistest.Private(t).Client(t)
	mw := idempotency.New(rdb)
	log := New(rdb, "orders", "test")
	ctx := context.Background()
	ev := Event{Order: 8, Status: "paid"}

	var stale context.Context
	release := errors.New("released")
	idempotency.Do(ctx, mw, idempotency.Key{ID: "order-8"}, func(ctx context.Context) (Effect, error) {
		stale = context.WithoutCancel(ctx) // keeps the first execution's fence
		return Effect{}, release
	})
	_, err := idempotency.Do(ctx, mw, idempotency.Key{ID: "order-8"}, func(ctx context.Context) (Effect, error) {
		return log.Record(ctx, "order-8", ev)
	})
	require.NoError(t, err)
	_, err = log.Record(stale, "order-8", ev)
	require.ErrorIs(t, err, optimistic.ErrStaleFence)
}
