package servertest_test

import (
	"time"

	"testing"

	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

func newStore(d *sqltest.DB, table string) (*sqlidem.Store, error) {
	return sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(table))
}

// Keys that differ only in case are two keys: MySQL's default collations
// would fold them into one.
func TestKeysAreComparedByteForByte(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		s, err := newStore(d, d.Table(t, "outcomes"))
		must(t, err)
		must(t, s.CreateTable(t.Context()))
		must(t, s.CreateTable(t.Context())) // again: IF NOT EXISTS
		if _, _, err := s.Recover(t.Context(), "idem:{kAbC}:r", 5); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.Lookup(t.Context(), "idem:{kabc}:r"); err != nil || ok {
			t.Fatalf("lower-case key found (%v, %v)", ok, err)
		}
		row, ok, err := s.Lookup(t.Context(), "idem:{kAbC}:r")
		if err != nil || !ok || row.Done || row.Fence != 5 {
			t.Fatalf("fence row %+v (found %v, %v)", row, ok, err)
		}
		// A lower fence never lowers it.
		if _, _, err := s.Recover(t.Context(), "idem:{kAbC}:r", 4); err == nil {
			t.Fatal("an older execution's recovery succeeded against a newer fence")
		}
		n, err := s.Purge(t.Context(), timeFarAhead)
		if err != nil || n != 1 {
			t.Fatalf("Purge: %d, %v", n, err)
		}
	})
}

var timeFarAhead = time.Now().Add(time.Hour)
