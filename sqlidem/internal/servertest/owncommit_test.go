package servertest_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// A handler that commits its transaction itself (a misuse) committed its
// writes without the outcome row: it is never answered "not executed", its
// key is never released, and no retry runs it again.
func TestHandlerThatCommitsItselfRunsOnce(t *testing.T) {
	for _, how := range []string{"commits and returns", "commits and writes on"} {
		t.Run(how, func(t *testing.T) {
			sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
				effects := d.Table(t, "effects")
				must(t, exec(d.DB, "CREATE TABLE "+effects+" (n INTEGER)"))
				insert := d.Dialect.Bind("INSERT INTO " + effects + " (n) VALUES (?)")
				var runs atomic.Int64
				srv, _ := protected(t, d, func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
					runs.Add(1)
					if _, err := tx.ExecContext(r.Context(), insert, 1); err != nil {
						return err
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					if how == "commits and writes on" {
						if _, err := tx.ExecContext(r.Context(), insert, 2); err != nil {
							return err // sql.ErrTxDone
						}
					}
					w.WriteHeader(http.StatusCreated)
					return nil
				})
				for i := range 3 {
					r := postKey(t, srv, "k1")
					if r.status != http.StatusConflict || r.problem != "interrupted" {
						t.Fatalf("request %d: %d %q; want 409 interrupted (the outcome is unknown), never 503", i, r.status, r.problem)
					}
				}
				var n int
				must(t, d.QueryRow("SELECT COUNT(*) FROM "+effects).Scan(&n))
				if runs.Load() != 1 || n != 1 {
					t.Fatalf("the handler ran %d times, %d rows committed; want once", runs.Load(), n)
				}
			})
		})
	}
}

// The same through Do and Run: a redelivered message never runs again.
func TestRunThatCommitsItselfRunsOnce(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d)
		l.hook = func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, d.Dialect.Bind("INSERT INTO "+l.table+" (msg, amount) VALUES (?, ?)"), "m1", 5)
			if err == nil {
				err = tx.Commit()
			}
			return err
		}
		for i := range 3 {
			_, err := l.consume("m1", 5)
			if !errors.Is(err, sqlidem.ErrOutcomeUnknown) || !errors.Is(err, idempotency.ErrInterrupted) {
				t.Fatalf("delivery %d: %v; want ErrOutcomeUnknown", i, err)
			}
		}
		var n int
		must(t, d.QueryRow("SELECT COUNT(*) FROM "+l.table).Scan(&n))
		if l.calls.Load() != 1 || n != 1 {
			t.Fatalf("the charge ran %d times, %d rows committed; want once", l.calls.Load(), n)
		}
	})
}
