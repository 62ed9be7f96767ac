package servertest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
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
