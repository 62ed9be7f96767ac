package servertest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// An answer over the middleware's WithMaxResponseBytes reaches its client
// whole, and commits as executed and not replayable: every duplicate, from
// Redis, from SQL after Redis forgot, or through recovery, is answered 409
// not-replayable, and the transfer runs once.
func TestAnswerOverTheLimitCommitsAsExecuted(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d, idempotency.WithMaxResponseBytes(64))
		b.pad = 1000
		first := b.post("k1", 3)
		if first.status != 201 || len(first.body) < 1000 || !strings.HasSuffix(first.body, `"}`) {
			t.Fatalf("first: %d, %d bytes; want the whole answer", first.status, len(first.body))
		}
		row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key)
		must(t, err)
		if !ok || !row.Done || !row.Answer.NotReplayable || row.Answer.Status != 201 || len(row.Answer.Body) != 0 {
			t.Fatalf("outcome row %+v (found %v); want executed, not replayable, status 201", row, ok)
		}
		if r := b.post("k1", 3); r.status != 409 || r.problem != "not-replayable" {
			t.Fatalf("duplicate: %+v", r)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
		if r := b.post("k1", 3); r.status != 409 || r.problem != "not-replayable" {
			t.Fatalf("duplicate after Redis forgot: %+v", r)
		}
		b.abandon("k1")
		if r := b.post("k1", 3); r.status != 409 || r.problem != "not-replayable" {
			t.Fatalf("recovery: %+v", r)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
		if from, to := b.balances(); from != 1000000-3 || to != 3 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// On MySQL and MariaDB an answer larger than max_allowed_packet cannot go
// into the row, whatever the middleware's limit: it commits as executed,
// once, rather than failing every commit while every retry runs the
// transfer again.
func TestAnswerOverMaxAllowedPacket(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind != sqltest.MySQL {
			t.Skip("only MySQL and MariaDB refuse a statement for its size below the limits that matter here")
		}
		var packet int
		must(t, d.QueryRow("SELECT @@max_allowed_packet").Scan(&packet))
		b := newBank(t, d, idempotency.WithMaxResponseBytes(packet+(2<<20)))
		b.pad = packet + 1<<20
		first := b.post("k1", 3)
		if first.status != 201 || len(first.body) < b.pad {
			t.Fatalf("first: %d, %d bytes %.200s; want the whole answer", first.status, len(first.body), first.body)
		}
		row, ok, err := b.store.Lookup(t.Context(), b.execution("k1").Key)
		must(t, err)
		if !ok || !row.Answer.NotReplayable {
			t.Fatalf("outcome row %+v (found %v); want executed, not replayable", row.Answer.Status, ok)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
		if r := b.post("k1", 3); r.status != 409 || r.problem != "not-replayable" {
			t.Fatalf("duplicate: %d %s", r.status, r.problem)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("transfer ran %d times", b.runs.Load())
		}
	})
}

// Run: a result over the limit is returned to its caller, and every
// redelivery gets ErrNotReplayable, from Redis or from SQL.
func TestRunResultOverTheLimit(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d, idempotency.WithMaxResponseBytes(64))
		l.note = strings.Repeat("n", 200)
		r, err := l.consume("m1", 4)
		if err != nil || r.Note != l.note {
			t.Fatalf("first: %+v, %v", r.Charge, err)
		}
		if _, err := l.consume("m1", 4); !errors.Is(err, idempotency.ErrNotReplayable) {
			t.Fatalf("redelivery: %v", err)
		}
		rdb := l.rdb(t)
		must(t, rdb.Del(t.Context(), l.record).Err())
		if _, err := l.consume("m1", 4); !errors.Is(err, idempotency.ErrNotReplayable) {
			t.Fatalf("redelivery after Redis forgot: %v", err)
		}
		if l.rows() != 1 || l.runs.Load() != 1 {
			t.Fatalf("%d ledger rows, %d runs", l.rows(), l.runs.Load())
		}
	})
}

// A pool of one connection is enough: nothing sqlidem does inside a
// transaction needs a second one (on MySQL, the first commit reads
// max_allowed_packet through the transaction's own connection).
func TestPoolOfOneConnection(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		one := mustOpen(t, d.Driver, d.DSN)
		one.SetMaxOpenConns(1)
		c := *d
		c.DB = one
		b := newBank(t, &c, idempotency.WithExecutionTimeout(5*time.Second))
		if r := b.post("k1", 2); r.status != 201 {
			t.Fatalf("first transfer on a pool of one connection: %d %s", r.status, r.problem)
		}
		if r := b.post("k1", 2); !r.replayed {
			t.Fatalf("duplicate: %+v", r)
		}
	})
}
