package sqlstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// An instance that starts while a transaction on the keys table is open (a
// handler's, through sqlidem, or one whose connection hangs) takes no lock
// that waits for it: CREATE INDEX IF NOT EXISTS takes the table's share
// lock before it finds the index, and every write after it would have
// queued behind it, on every instance, until that transaction ended.
func TestStartingBesideAnOpenTransactionTakesNoTableLock(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	table := d.Table(t, "idem_start")
	ctx := context.Background()
	first := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
	require.NoError(t, first.Ready(ctx))

	tx, err := d.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES ('held by an open transaction')")
	require.NoError(t, err)

	started := time.Now()
	bounded, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	next := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
	require.NoError(t, next.Ready(bounded), "a new instance waited for another's transaction")
	require.Less(t, time.Since(started), time.Second)
}
