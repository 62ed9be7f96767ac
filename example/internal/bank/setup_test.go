package bank

import (
	"sync"
	"testing"

	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// Several instances may set the bank up at once, at start-up.
func TestSetupConcurrently(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		prefix := d.Table(t, "setup") + "_"
		t.Cleanup(func() {
			for _, table := range []string{"accounts", "transfers", sqlidem.DefaultTable} {
				d.Exec("DROP TABLE IF EXISTS " + prefix + table)
			}
		})
		b, err := New(d.DB, d.Dialect, prefix)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				errs <- b.Setup(t.Context(), DemoAccounts)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent Setup: %v", err)
			}
		}
		accounts, err := b.Accounts(t.Context())
		if err != nil || len(accounts) != len(DemoAccounts) {
			t.Fatalf("accounts %v, %v", accounts, err)
		}
	})
}
