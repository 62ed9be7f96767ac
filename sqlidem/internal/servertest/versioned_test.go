package servertest_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/optimistic"
)

// A versioned debit inside a protected handler (key, then a versioned
// update with Retry on the handler's tx) works at each database's default
// isolation: concurrent payments from one account all commit, once each.
// At MySQL's REPEATABLE READ the transaction's snapshot cannot see the
// version that refused the write; the conflict says so (SQLSTATE 40001)
// and the whole transaction runs again, as often as it takes.
func TestVersionedDebitInsideTheTransaction(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		accounts := d.Table(t, "accounts")
		must(t, exec(d.DB, "CREATE TABLE "+accounts+" (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 0)"))
		must(t, exec(d.DB, "INSERT INTO "+accounts+" (id, balance, version) VALUES (1, 1000, 0)"))
		table := optimistic.Table{Dialect: d.Dialect, Name: accounts}
		read := d.Dialect.Bind("SELECT balance, version FROM " + accounts + " WHERE id = ?")
		var debits atomic.Int64
		srv, _ := protected(t, d, func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
			err := optimistic.Retry(r.Context(), optimistic.Policy{}, func(ctx context.Context) error {
				var balance, version int64
				if err := tx.QueryRowContext(ctx, read, 1).Scan(&balance, &version); err != nil {
					return err
				}
				time.Sleep(time.Millisecond) // another payment lands between the read and the write
				_, err := table.Update(ctx, tx, 1, version, optimistic.Set("balance", balance-10))
				return err
			})
			if err != nil {
				return err
			}
			debits.Add(1)
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				// Contention is not unavailability: each payment is
				// answered 201 on its one try, its transaction run again
				// for as long as it takes.
				if r := postKey(t, srv, fmt.Sprintf("pay-%d", i)); r.status != http.StatusCreated {
					t.Errorf("payment %d: %d %s; want 201", i, r.status, r.problem)
				}
			})
		}
		wg.Wait()
		var balance int64
		must(t, d.QueryRow("SELECT balance FROM "+accounts+" WHERE id = 1").Scan(&balance))
		if balance != 1000-10*10 {
			t.Fatalf("balance %d after 10 payments of 10 (%d debits committed)", balance, debits.Load())
		}
	})
}
