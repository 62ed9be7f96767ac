package servertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// An instance that starts while a commit holds the outcome table's rows
// finds the table ready without waiting for that commit, and holds up no
// other key's commit meanwhile.
func TestCreateTableDoesNotWaitForARunningCommit(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.SQLite {
			t.Skip("SQLite has one writer: a running commit holds the whole file for every statement")
		}
		table := d.Table(t, "outcomes")
		s, err := newStore(d, table)
		must(t, err)
		must(t, s.CreateTable(t.Context()))

		// A slow commit: a row written, its transaction still open.
		slow, err := d.BeginTx(t.Context(), nil)
		must(t, err)
		defer slow.Rollback()
		_, err = slow.ExecContext(t.Context(), d.Dialect.Bind("INSERT INTO "+table+
			" (record_key, fingerprint, fence, state, status, header, body, written_ms) VALUES (?, '', 1, 'done', 200, '{}', NULL, 1)"), "slow")
		must(t, err)

		// A new instance starts.
		started := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			other, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(table))
			if err == nil {
				err = other.CreateTable(ctx)
			}
			started <- err
		}()
		began := time.Now()
		select {
		case err := <-started:
			must(t, err)
		case <-time.After(2 * time.Second):
			t.Fatal("CreateTable on an existing table waited 2 s for a running commit")
		}
		// Meanwhile another key commits at once.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, _, err = s.Recover(ctx, "other-key", 7)
		must(t, err)
		if took := time.Since(began); took > time.Second {
			t.Fatalf("start-up and another key's write took %v behind a running commit", took)
		}
	})
}
