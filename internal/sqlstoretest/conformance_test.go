package sqlstoretest

import (
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/storetest"
)

// The store conformance kit on SQL (NewSQL), on every database sqltest
// reaches: each promise in a table of its own, dropped when the promise's
// subtest ends.
func TestStoreConformanceSQL(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		storetest.Run(t, func(t *testing.T) storetest.Keyspace {
			table := d.Table(t, "idem_keys")
			return func(opts ...idempotency.Option) *idempotency.Middleware {
				return idempotency.NewSQL(d.DB, d.Dialect, append([]idempotency.Option{idempotency.WithSQLTable(table)}, opts...)...)
			}
		})
	})
}
