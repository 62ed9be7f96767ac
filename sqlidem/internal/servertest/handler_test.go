package servertest_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

func TestTransferCommitsOnceAndReplays(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		first := b.post("k1", 70)
		if first.status != 201 || first.replayed {
			t.Fatalf("first: %+v", first)
		}
		again := b.post("k1", 70)
		if again.status != 201 || !again.replayed || again.body != first.body {
			t.Fatalf("duplicate: %+v, first %+v", again, first)
		}
		if from, to := b.balances(); from != 1000000-70 || to != 70 {
			t.Fatalf("balances %d, %d after one transfer of 70", from, to)
		}
		row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key)
		must(t, err)
		if !ok || !row.Done || row.Answer.Status != 201 || string(row.Answer.Body) != first.body ||
			row.Fence != b.execution("k1").Fence || row.Answer.Fingerprint != b.execution("k1").Fingerprint {
			t.Fatalf("outcome row %+v (found %v); want the first answer under its fence and fingerprint", row, ok)
		}
	})
}

func TestRedisForgetsButSQLRemembers(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		first := b.post("k1", 5)
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err()) // a flush, an eviction, a failover
		again := b.post("k1", 5)
		if again.status != 201 || !again.replayed || again.body != first.body {
			t.Fatalf("after Redis forgot: %+v, first %+v", again, first)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
		if from, _ := b.balances(); from != 1000000-5 {
			t.Fatalf("balance %d", from)
		}
		if st := b.redisState("k1"); st != "done" {
			t.Fatalf("Redis record state %q after the replay; want it stored again", st)
		}
		// The same key for another transfer is refused, not run.
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
		if other := b.post("k1", 6); other.status != 422 || other.problem != "key-reused" {
			t.Fatalf("key reused after Redis forgot: %+v", other)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
	})
}

func TestFailedTransferCommitsNothingAndReleasesTheKey(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		if bad := b.post("k1", -1); bad.status != 422 || bad.replayed {
			t.Fatalf("bad amount: %+v", bad)
		}
		if row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key); err != nil || ok {
			t.Fatalf("row %+v (found %v, %v) after a rolled-back transfer", row, ok, err)
		}
		// Released: the corrected request under the same key runs.
		if fixed := b.post("k1", 3); fixed.status != 201 || fixed.replayed {
			t.Fatalf("corrected retry: %+v", fixed)
		}
		if from, to := b.balances(); from != 1000000-3 || to != 3 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// A transfer that wrote its 201 and then failed committed nothing: its
// client must not be told it succeeded, and the key is released, so that
// the retry runs and its receipt is the one that committed.
func TestRolledBackSuccessIsNotSent(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		b.failAfter = errors.New("the ledger refused the transfer after the receipt was written")
		r := b.post("k1", 7)
		if r.status < 400 {
			t.Fatalf("a transfer whose writes rolled back answered %d %s", r.status, r.body)
		}
		if r.status != 500 || r.problem != "internal" {
			t.Fatalf("answered %+v; want the error handler's 500", r)
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d after a rolled-back transfer", from, to)
		}
		b.failAfter = nil
		retry := b.post("k1", 7)
		if retry.status != 201 || retry.replayed {
			t.Fatalf("retry: %+v; want it to run, the key released", retry)
		}
		row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key)
		must(t, err)
		if !ok || string(row.Answer.Body) != retry.body {
			t.Fatalf("committed %q, answered %q", row.Answer.Body, retry.body)
		}
	})
}

// Header values are bytes: a replay from SQL sends them as the handler
// did, whether they are ASCII, UTF-8 (a euro sign), or neither, and on
// MySQL in a latin1 table too.
func TestHeaderBytesSurviveTheOutcomeRow(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		b.header = http.Header{"X-Fee": {"10 €"}, "Content-Disposition": {"attachment; filename=\"caf\xe9.pdf\""}}
		first := b.post("k1", 4)
		if first.status != 201 {
			t.Fatalf("first: %+v", first)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err()) // replayed from SQL, not Redis
		again := b.post("k1", 4)
		if !again.replayed {
			t.Fatalf("second: %+v", again)
		}
		for name, values := range b.header {
			if got := again.header.Values(name); len(got) != 1 || got[0] != values[0] {
				t.Errorf("%s replayed from SQL as %q; want %q", name, got, values)
			}
		}
	})
}

// An answer replayed from its committed row follows the middleware's
// replay rules, as one replayed from Redis does: the header allowlist, the
// replay hook, the marker.
func TestReplayFromTheRowFollowsTheReplayRules(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		var hooked atomic.Int64
		b := newBank(t, d, idempotency.WithReplayHeaders("Content-Type", "X-Fee"),
			idempotency.WithReplayHook(func(r *http.Request, status int, h http.Header) {
				hooked.Add(1)
				h.Set("X-Replay-Hook", "called")
			}))
		b.header = http.Header{"X-Fee": {"10"}, "X-Session-Token": {"secret"}}
		first := b.post("k1", 4)
		if first.status != 201 || first.header.Get("X-Session-Token") != "secret" {
			t.Fatalf("first: %+v", first)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err()) // replayed from SQL, not Redis
		again := b.post("k1", 4)
		switch {
		case !again.replayed || again.body != first.body:
			t.Fatalf("second: %+v", again)
		case again.header.Get("X-Session-Token") != "":
			t.Errorf("a header the allowlist excludes was replayed: %q", again.header.Get("X-Session-Token"))
		case again.header.Get("X-Fee") != "10":
			t.Errorf("X-Fee replayed as %q", again.header.Get("X-Fee"))
		case again.header.Get("X-Replay-Hook") != "called" || hooked.Load() != 1:
			t.Errorf("the replay hook ran %d times", hooked.Load())
		}
		// Redis keeps the committed answer again, not the hook's additions.
		third := b.post("k1", 4)
		if !third.replayed || third.body != first.body || hooked.Load() != 2 || third.header.Get("X-Session-Token") != "" {
			t.Fatalf("third: %+v, hook ran %d times", third, hooked.Load())
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
	})
}
