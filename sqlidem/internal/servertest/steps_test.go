package servertest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// A transfer that also calls another system puts the call in a Step. A run
// cut off after the step (its lease lost in the middle of the transaction)
// commits nothing; the retry takes it over, and gets the step's journaled
// result instead of calling again, while the SQL writes, which rolled back,
// run again under the retry's fence and commit once. The writes need no
// journal: only the call outside the transaction does.
func TestResumedTransferDoesNotRepeatItsStep(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d, idempotency.WithLockLease(300*time.Millisecond), idempotency.WithResume())
		var calls atomic.Int64
		var keys [2]string
		var cut atomic.Bool
		b.first = func(ctx context.Context) {
			n, err := idempotency.Step(ctx, "notify", func(ctx context.Context) (int64, error) {
				return calls.Add(1), nil
			})
			if err != nil || n != 1 {
				t.Errorf("step: %d, %v; want the first call's result", n, err)
			}
			if !cut.Swap(true) {
				keys[0] = idempotency.StepKey(ctx, "notify")
				b.loseLease(ctx, b.record("k1"))
				return
			}
			keys[1] = idempotency.StepKey(ctx, "notify")
		}
		if r := b.post("k1", 8); r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("cut off mid-transaction: %+v; want 409 in-progress", r)
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d after the cut-off run", from, to)
		}
		retry := b.post("k1", 8)
		if retry.status != 201 || retry.replayed {
			t.Fatalf("retry: %+v", retry)
		}
		if calls.Load() != 1 {
			t.Fatalf("the step's call ran %d times", calls.Load())
		}
		if keys[0] == "" || keys[0] != keys[1] {
			t.Fatalf("step keys %q; want one, the same for both runs", keys)
		}
		if from, to := b.balances(); from != 1000000-8 || to != 8 || b.runs.Load() != 1 {
			t.Fatalf("balances %d, %d after %d runs", from, to, b.runs.Load())
		}
		if again := b.post("k1", 8); !again.replayed || again.body != retry.body {
			t.Fatalf("duplicate: %+v", again)
		}
	})
}

// A transaction the database aborts after a step took effect runs again,
// handler and all: the step is the execution's, and the attempt that runs
// again gets its result back, without calling again and without
// ErrStepRepeated (which would answer 500 after the charge, with no
// transfer). With WithResume or without.
func TestAbortedTransactionGetsItsStepBack(t *testing.T) {
	for _, resume := range []bool{false, true} {
		t.Run(fmt.Sprint("resume=", resume), func(t *testing.T) {
			sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
				d = deferred(t, d)
				var opts []idempotency.Option
				if resume {
					opts = append(opts, idempotency.WithResume())
				}
				b := newBank(t, d, opts...)
				b.beforeDebit = abortsOnce(t, d)
				var calls atomic.Int64
				b.first = func(ctx context.Context) {
					n, err := idempotency.Step(ctx, "charge", func(ctx context.Context) (int64, error) {
						return calls.Add(1), nil
					})
					if err != nil || n != 1 {
						t.Errorf("step: %d, %v; want the first call's result", n, err)
					}
				}
				r := b.post("k1", 5)
				if r.status != 201 || r.replayed {
					t.Fatalf("answered %+v; want the transfer's 201 after one more attempt", r)
				}
				if b.calls.Load() != 2 || calls.Load() != 1 {
					t.Fatalf("%d attempts made %d charges; want 2 attempts, 1 charge", b.calls.Load(), calls.Load())
				}
				if from, to := b.balances(); from != 1000000-5 || to != 5 {
					t.Fatalf("balances %d, %d", from, to)
				}
			})
		})
	}
}

// The same inside Do: sqlidem.Run's attempt after an abort gets the step
// its first attempt finished.
func TestAbortedRunGetsItsStepBack(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		d = deferred(t, d)
		l := newLedger(t, d)
		abort := abortsOnce(t, d)
		var calls atomic.Int64
		l.hook = func(ctx context.Context, tx *sql.Tx) error {
			if _, err := idempotency.Step(ctx, "charge", func(context.Context) (int64, error) { return calls.Add(1), nil }); err != nil {
				return err
			}
			return abort(ctx, tx)
		}
		got, err := l.consume("m1", 7, idempotency.Resumable())
		if err != nil || got.Charge != 7 {
			t.Fatalf("consume: %+v, %v; want the charge's receipt", got, err)
		}
		if l.calls.Load() != 2 || calls.Load() != 1 {
			t.Fatalf("%d attempts made %d charges; want 2 attempts, 1 charge", l.calls.Load(), calls.Load())
		}
	})
}

// A run whose SQL outlasts the execution timeout after a step took effect
// is never answered "not executed" (503 store-unavailable: a client that
// trusts it starts over with a new key, and is charged twice): it is
// answered what a duplicate would get, in progress, and the retry gets the
// resumed run's answer, the step not made again.
func TestACutOffAfterAStepIsNotAnsweredNotExecuted(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d, idempotency.WithResume(), idempotency.WithExecutionTimeout(500*time.Millisecond))
		var calls atomic.Int64
		var slow atomic.Bool
		b.beforeDebit = func(ctx context.Context, tx *sql.Tx) error {
			if _, err := idempotency.Step(ctx, "charge", func(context.Context) (int64, error) { return calls.Add(1), nil }); err != nil {
				return err
			}
			if !slow.Swap(true) {
				<-ctx.Done() // the SQL that follows runs past the execution timeout
			}
			return nil
		}
		r := b.post("k1", 5)
		if r.status != 409 || r.problem != "in-progress" || r.header.Get("Retry-After") == "" {
			t.Fatalf("cut off after the charge: %+v; want 409 in-progress with Retry-After", r)
		}
		retry := b.postWhileInProgress("k1", 5)
		if retry.status != 201 || calls.Load() != 1 {
			t.Fatalf("retry: %+v after %d charges; want 201 after one", retry, calls.Load())
		}
	})
}

// The same through Do and sqlidem.Run: no ErrStoreUnavailable once a step
// took effect, but ErrInProgress.
func TestACutOffRunAfterAStepIsNotStoreUnavailable(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d, idempotency.WithExecutionTimeout(500*time.Millisecond))
		l.hook = func(ctx context.Context, tx *sql.Tx) error {
			if _, err := idempotency.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		}
		_, err := l.consume("m1", 7, idempotency.Resumable())
		if errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("cut off after a step: %v; want ErrInProgress, not ErrStoreUnavailable", err)
		}
	})
}

// A Store's own error handler is told what the client may be told: after a
// step, a transaction the database kept aborting is in progress (the run is
// kept, and the retry resumes it without charging again), never
// ErrStoreUnavailable, whose answer says nothing ran.
func TestAStoresOwnErrorHandlerIsToldTheTruthAfterAStep(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		d = deferred(t, d)
		var told atomic.Value
		b := newBankWith(t, d, []sqlidem.Option{sqlidem.WithAttempts(1),
			sqlidem.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				told.Store(err)
				idempotency.WriteError(w, r, err)
			})}, idempotency.WithResume())
		abort := abortsOnce(t, d)
		var calls atomic.Int64
		b.beforeDebit = func(ctx context.Context, tx *sql.Tx) error {
			if _, err := idempotency.Step(ctx, "charge", func(context.Context) (int64, error) { return calls.Add(1), nil }); err != nil {
				return err
			}
			return abort(ctx, tx)
		}
		first := b.post("k1", 5)
		err, _ := told.Load().(error)
		if first.status != 409 || !errors.Is(err, idempotency.ErrInProgress) || errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Fatalf("after the charge, the aborted transaction: %+v, the handler told %v; want 409 in progress", first, err)
		}
		retry := b.postWhileInProgress("k1", 5)
		if retry.status != 201 || calls.Load() != 1 {
			t.Fatalf("retry: %+v after %d charges; want 201 after one", retry, calls.Load())
		}
	})
}

// postWhileInProgress sends the transfer again until it is no longer
// answered 409 (a kept run the retry resumes), for five seconds at most.
func (b *bank) postWhileInProgress(key string, amount int64) reply {
	var r reply
	for range 50 {
		if r = b.post(key, amount); r.status != 409 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return r
}
