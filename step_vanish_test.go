package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A key's record that vanishes while its run takes steps (the record's TTL
// ran out, an eviction; a restart takes the lock too, and stops the run at
// its next step: docs/recovery.md) is no failure of the step
// that took effect after it: the run goes on, and its true answer is
// stored (the record written back) and replayed, not a failure built on an
// "another execution's now" that nobody is.
func TestAVanishedRecordIsNoFailureOfTheStepAfterIt(t *testing.T) {
	t.Run("handler", func(t *testing.T) {
		s := newShop(t, WithResume())
		var shipped int
		s.handler = func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			if _, err := Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
				http.Error(w, "the charge failed", http.StatusBadGateway)
				return
			}
			e, _ := ExecutionOf(ctx)
			require.NoError(t, s.rdb.Del(ctx, e.Key).Err())
			n, err := Step(ctx, "ship", func(context.Context) (int, error) { shipped++; return shipped, nil })
			if err != nil {
				http.Error(w, "the shipment failed", http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"shipment":%d}`, n)
		}
		c := s.client()
		first := s.post(c, "/payments", "k", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		dup := s.post(c, "/payments", "k", `{}`)
		require.Equal(t, http.StatusCreated, dup.status, dup.body)
		require.Equal(t, "true", dup.header.Get(ReplayedHeader), "the answer was stored")
		require.Equal(t, first.body, dup.body)
		require.Equal(t, 1, shipped)
	})
	t.Run("Do with StoreErrors", func(t *testing.T) {
		m, _ := twoInstances(t)
		k := functionKeys(m, "k")
		fn := func(ctx context.Context) (string, error) {
			if _, err := Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
				return "", err
			}
			require.NoError(t, m.redis.client.Del(ctx, k.record).Err())
			return Step(ctx, "ship", func(context.Context) (string, error) { return "shipped", nil })
		}
		got, err := Do(context.Background(), m, Key{ID: "k"}, fn, Resumable(), StoreErrors())
		require.NoError(t, err)
		require.Equal(t, "shipped", got)
		var o Outcome
		again, err := Do(context.Background(), m, Key{ID: "k"}, fn, Resumable(), StoreErrors(), ReportOutcome(&o))
		require.NoError(t, err)
		require.Equal(t, Replayed, o)
		require.Equal(t, "shipped", again)
	})
}

// A run that takes a kept run over gets a record that lives the record
// TTL from the takeover, not what was left of the dead run's: otherwise
// the record may run out under the resumed run's steps.
func TestATakeoverGivesTheRecordItsTTL(t *testing.T) {
	m, _ := twoInstances(t, WithRecordTTL(time.Hour))
	k := functionKeys(m, "k")
	failing := errors.New("the shipment failed")
	_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
		if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		return 0, failing // kept: the charge is journaled
	}, Resumable())
	require.ErrorIs(t, err, failing)
	ctx := context.Background()
	require.NoError(t, m.redis.client.PExpire(ctx, k.record, 2*time.Second).Err(), "the dead run's record near its end")

	var left time.Duration
	_, err = Do(ctx, m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
		left = m.redis.client.PTTL(ctx, k.record).Val()
		return 1, nil
	}, Resumable())
	require.NoError(t, err)
	require.Greater(t, left, 30*time.Minute, "the resumed run's record keeps the dead run's TTL")
}
