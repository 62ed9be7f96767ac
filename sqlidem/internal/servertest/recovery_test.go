package servertest_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// An abandoned execution that committed: the retry replays the committed
// answer and stores it in Redis, and the transfer does not run again.
func TestRecoveryReplaysACommittedAnswer(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		first := b.post("k1", 40)
		b.abandon("k1")
		entered := b.entered.Load()
		again := b.post("k1", 40)
		if b.entered.Load() != entered || b.recovered.Load() != 1 {
			t.Fatalf("handler entered %d times, Recover called %d times; want the middleware to recover the answer itself",
				b.entered.Load()-entered, b.recovered.Load())
		}
		if again.status != 201 || !again.replayed || again.body != first.body {
			t.Fatalf("retry of an abandoned execution that committed: %+v, first %+v", again, first)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
		if st := b.redisState("k1"); st != "done" {
			t.Fatalf("Redis record state %q after recovery; want the answer stored", st)
		}
		if from, to := b.balances(); from != 1000000-40 || to != 40 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// An abandoned execution that committed nothing: the retry runs the
// transfer again, under a higher fencing token, once.
func TestRecoveryRunsAgainWhenNothingCommitted(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		b.post("k1", 0) // rolled back and released: nothing committed
		b.post("k1", 9) // commits
		committed := b.execution("k1")
		// Now pretend the commit never happened and the instance died.
		must(t, exec(d.DB, "DELETE FROM "+b.outcomes))
		b.abandon("k1")
		retry := b.post("k1", 9)
		if b.recovered.Load() != 1 {
			t.Fatalf("Recover called %d times; want once, by the retry that took over", b.recovered.Load())
		}
		if retry.status != 201 || retry.replayed {
			t.Fatalf("retry of an abandoned execution that committed nothing: %+v", retry)
		}
		rerun := b.execution("k1")
		if rerun.Fence <= committed.Fence {
			t.Fatalf("rerun fence %d not above the abandoned one %d", rerun.Fence, committed.Fence)
		}
		row, ok, err := b.store.Lookup(t.Context(), rerun.Key)
		must(t, err)
		if !ok || !row.Done || row.Fence != rerun.Fence {
			t.Fatalf("outcome row %+v (found %v); want the rerun's", row, ok)
		}
		if again := b.post("k1", 9); !again.replayed || again.body != retry.body {
			t.Fatalf("duplicate after the rerun: %+v", again)
		}
	})
}

// Without an outcome store, the same abandoned execution is answered 409
// interrupted: a Redis record alone cannot say whether it committed.
func TestWithoutOutcomeStoreAbandonedIsInterrupted(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	b := newBank(t, d, idempotency.WithOutcomeStore(nil))
	b.post("k1", 1)
	b.abandon("k1")
	if r := b.post("k1", 1); r.status != 409 || r.problem != "interrupted" {
		t.Fatalf("got %+v; want 409 interrupted", r)
	}
}

// A stale executor, paused after its claim while recovery fenced its key
// for a newer execution, cannot commit: its transfer never runs.
func TestStaleExecutorPausedBeforeItsTransaction(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		b.before = func(_ context.Context, e idempotency.Execution) {
			// Another instance took the key over meanwhile.
			_, committed, err := b.store.Recover(context.Background(), e.Key, e.Fence+1)
			if err != nil || committed {
				t.Errorf("Recover: committed %v, %v", committed, err)
			}
		}
		r := b.post("k1", 11)
		if r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("stale executor answered %+v; want 409 in-progress", r)
		}
		if b.runs.Load() != 0 {
			t.Fatal("the stale executor's transfer ran")
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d after a refused transfer", from, to)
		}
	})
}

// The same, paused inside its transaction after its writes: the writes
// roll back with the outcome row that cannot go in.
func TestStaleExecutorPausedInsideItsTransaction(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.SQLite {
			t.Skip("SQLite has one writer at a time: the paused transaction holds it, so no other " +
				"execution can fence or commit until it ends (covered by the paused-before test)")
		}
		b := newBank(t, d)
		b.inside = func(e idempotency.Execution) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, committed, err := b.store.Recover(ctx, e.Key, e.Fence+1)
			if err != nil || committed {
				t.Errorf("Recover: committed %v, %v", committed, err)
			}
		}
		r := b.post("k1", 11)
		if r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("stale executor answered %+v; want 409 in-progress", r)
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d: the stale executor's writes committed", from, to)
		}
		row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key)
		must(t, err)
		if !ok || row.Done || row.Fence != b.execution("k1").Fence+1 {
			t.Fatalf("row %+v (found %v); want the newer execution's fence", row, ok)
		}
	})
}

func TestNewRefusesBadOptions(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	for _, name := range []string{"", "a;b", "1x", "a.b.c", "x y", strings.Repeat("a", 64)} {
		if _, err := newStore(d, name); err == nil {
			t.Errorf("table %q accepted", name)
		}
	}
	if _, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithAttempts(0)); err == nil {
		t.Error("WithAttempts(0) accepted")
	}
}

// An execution whose lease is lost mid-transaction (Redis forgot its lock,
// or stalled past the lease) is cancelled by the middleware: its writes
// roll back, and its client is told to retry, never a 500.
func TestLeaseLostMidTransactionAnswersInProgress(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d, idempotency.WithLockLease(300*time.Millisecond))
		b.first = func(ctx context.Context) { b.loseLease(ctx, b.record("k1")) }
		r := b.post("k1", 8)
		if r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("lease lost mid-transaction: %+v; want 409 in-progress", r)
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d", from, to)
		}
		b.first = nil
		if retry := b.post("k1", 8); retry.status != 201 || retry.replayed {
			t.Fatalf("retry: %+v", retry)
		}
	})
}

// A committed answer that cannot be read is answered 409 unreadable-record,
// by recovery and by the handler's own read alike: it ran, and retrying
// cannot change that. Never 503, never a second run.
func TestUnreadableCommittedAnswer(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		b.post("k1", 6)
		must(t, exec(d.DB, "UPDATE "+b.outcomes+" SET header = 'not json'"))
		b.abandon("k1")
		if r := b.post("k1", 6); r.status != 409 || r.problem != "unreadable-record" {
			t.Fatalf("recovery of an unreadable answer: %+v", r)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
		if r := b.post("k1", 6); r.status != 409 || r.problem != "unreadable-record" {
			t.Fatalf("the handler's read of an unreadable answer: %+v", r)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
	})
}

// A lease lost before the transaction began (the executor paused after
// its claim) answers in-progress too: the cancelled BEGIN or first read is
// no failure of the database.
func TestLeaseLostBeforeTheTransactionAnswersInProgress(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d, idempotency.WithLockLease(300*time.Millisecond))
		b.before = func(ctx context.Context, e idempotency.Execution) { b.loseLease(ctx, e.Key) }
		if r := b.post("k1", 8); r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("lease lost before the transaction: %+v; want 409 in-progress", r)
		}
		if b.runs.Load() != 0 {
			t.Fatal("the transfer ran")
		}
	})
}

// sqlidem's refusals take the form of the middleware's own: its
// WithErrorHandler, by default.
func TestRefusalsUseTheMiddlewaresErrorHandler(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	b := newBank(t, d, idempotency.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		w.Header().Set("X-Error-Handler", "the application's")
		w.WriteHeader(idempotency.StatusCode(err))
	}))
	b.before = func(_ context.Context, e idempotency.Execution) {
		if _, _, err := b.store.Recover(context.Background(), e.Key, e.Fence+1); err != nil {
			t.Error(err)
		}
	}
	r := b.post("k1", 3)
	if r.status != 409 || r.header.Get("X-Error-Handler") != "the application's" {
		t.Fatalf("a stale executor's refusal: %+v; want the application's 409", r)
	}
}

// An executor paused after its outcome row's INSERT and before its COMMIT
// holds the row's lock: recovery's fence write waits for it, up to the
// recovering request's own time, and then knows what it did. (On SQLite
// the paused transaction holds the whole database from its BEGIN.)
func TestRecoveryWaitsForAnExecutorPausedBeforeItsCommit(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.SQLite {
			t.Skip("SQLite: a transaction holds the database's write lock from BEGIN; " +
				"every other writer waits for it (busy_timeout), recovery included")
		}
		table := d.Table(t, "outcomes")
		s, err := newStore(d, table)
		must(t, err)
		must(t, s.CreateTable(t.Context()))
		const key = "idem:{kpaused}:r"
		tx, err := d.BeginTx(t.Context(), nil)
		must(t, err)
		defer tx.Rollback()
		_, err = tx.Exec(d.Dialect.Bind("INSERT INTO "+table+
			" (record_key, fingerprint, fence, state, status, header, body, written_ms) VALUES (?, 'fp', 5, 'done', 201, '{}', NULL, 1)"), key)
		must(t, err)

		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		_, _, err = s.Recover(ctx, key, 6)
		cancel()
		if err == nil || ctx.Err() == nil {
			t.Fatalf("Recover beside a paused executor's uncommitted row: %v; want it to wait until its context ended", err)
		}
		must(t, tx.Commit()) // the executor resumes and commits
		a, committed, err := s.Recover(t.Context(), key, 6)
		if err != nil || !committed || a.Status != 201 {
			t.Fatalf("Recover after the commit: %+v, %v, %v; want the committed answer", a, committed, err)
		}
	})
}
