package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
)

// The function API (Do) and resumable runs (Step).

// A result is what the kit's functions return, as Do stores it.
type result struct {
	Run   int64
	Fence uint64
	What  string
}

// Do runs a function once per Key, however many calls on however many
// instances ask at once; every call gets its result, a later call on
// another instance replayed. The same ID with other Input is refused, and
// another ID runs again.
func doRunsOnce(t *testing.T, ks Keyspace) {
	const calls = 12
	var h runs
	var entered atomic.Int64
	fn := func(ctx context.Context) (result, error) {
		n := h.start(ctx)
		// Hold the run until every call has begun, so that the others
		// are duplicates of a running key (or, late, of a stored one).
		eventually(func() bool { return entered.Load() >= calls })
		return result{Run: n, Fence: idempotency.FencingToken(ctx), What: "shipped"}, nil
	}
	a := open(t, ks, idempotency.WithWaitTimeout(3*bound))
	b := open(t, ks, idempotency.WithWaitTimeout(3*bound))
	key := idempotency.Key{Scope: "queue", ID: "msg-1", Input: []byte(`{"order":1}`)}

	results := make([]result, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		m := a
		if i%2 == 1 {
			m = b
		}
		wg.Go(func() {
			entered.Add(1)
			results[i], errs[i] = idempotency.Do(context.Background(), m, key, fn)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, h.count(), "the function ran more than once")
	want := result{Run: 1, Fence: h.fence(1), What: "shipped"}
	require.NotZero(t, want.Fence)
	for _, r := range results {
		require.Equal(t, want, r)
	}

	var o idempotency.Outcome
	got, err := idempotency.Do(context.Background(), open(t, ks), key, fn, idempotency.ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, idempotency.Replayed, o)
	require.Equal(t, want, got)

	_, err = idempotency.Do(context.Background(), a, idempotency.Key{Scope: "queue", ID: "msg-1", Input: []byte(`{"order":2}`)}, fn)
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	require.EqualValues(t, 1, h.count())

	other, err := idempotency.Do(context.Background(), b, idempotency.Key{Scope: "queue", ID: "msg-2"}, fn)
	require.NoError(t, err)
	require.EqualValues(t, 2, other.Run)
}

// provider is a payment provider the kit's resumable runs charge through
// a Step: it counts the charges it made.
type provider struct{ charges atomic.Int64 }

func (p *provider) charge(ctx context.Context) (string, error) {
	return idempotency.Step(ctx, "charge", func(context.Context) (string, error) {
		return fmt.Sprintf("ch_%d", p.charges.Add(1)), nil
	})
}

// A resumable Do run that fails after its first Step is kept, not
// released; the next call, on another instance, resumes it: the
// journaled step returns its result without running, and the run's
// answer is built on it.
func resumeDo(t *testing.T, ks Keyspace) {
	var h runs
	var p provider
	fn := func(ctx context.Context) (result, error) {
		n := h.start(ctx)
		charge, err := p.charge(ctx)
		if err != nil {
			return result{}, err
		}
		if n == 1 {
			return result{}, errors.New("the shipping service failed")
		}
		return result{Run: n, Fence: idempotency.FencingToken(ctx), What: charge + " shipped"}, nil
	}
	a, b := open(t, ks), open(t, ks)
	key := idempotency.Key{ID: "order-1", Input: []byte(`{"order":1}`)}

	_, err := idempotency.Do(context.Background(), a, key, fn, idempotency.Resumable())
	require.Error(t, err)
	require.EqualValues(t, 1, p.charges.Load())

	var o idempotency.Outcome
	got, err := idempotency.Do(context.Background(), b, key, fn, idempotency.Resumable(), idempotency.ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, idempotency.Executed, o)
	require.Equal(t, "ch_1 shipped", got.What, "the resumed run got the journaled charge")
	require.EqualValues(t, 1, p.charges.Load(), "the journaled step did not run again")
	require.EqualValues(t, 2, h.count())
	h.requireFencesGrow(t)

	again, err := idempotency.Do(context.Background(), a, key, fn, idempotency.Resumable(), idempotency.ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, idempotency.Replayed, o)
	require.Equal(t, got, again)
	require.EqualValues(t, 2, h.count())
}

// Under WithResume, a handler whose answer the store policy would release
// after a Step journaled is kept instead; a retry on another instance
// resumes it, the journaled step not run again, under a greater fencing
// token.
func resumeHandler(t *testing.T, ks Keyspace) {
	var h runs
	var p provider
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		charge, err := p.charge(r.Context())
		if err != nil || n == 1 {
			http.Error(w, "the shipping service failed", http.StatusServiceUnavailable)
			return
		}
		created(w, n, charge)
	})
	opts := []idempotency.Option{idempotency.WithSharedKeys(), idempotency.WithResume(),
		idempotency.WithStorePolicy(idempotency.StoreNoTransient)}
	a, b := serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...)
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "answer: %s", first)
	require.EqualValues(t, 1, p.charges.Load())

	resumed := post(t, b.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, resumed.status, "answer: %s", resumed)
	require.False(t, resumed.replayed())
	require.JSONEq(t, `{"order":2,"what":"ch_1"}`, resumed.body, "the resumed run got the journaled charge")
	require.EqualValues(t, 1, p.charges.Load(), "the journaled step did not run again")
	require.EqualValues(t, 2, h.count())
	h.requireFencesGrow(t)

	requireReplay(t, resumed, post(t, a.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 2, h.count())
}
