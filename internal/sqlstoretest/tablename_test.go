package sqlstoretest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// A table name as long as WithSQLTable takes (63 bytes) gets its table and
// the index the purge reads, on every database: MySQL refused the index's
// name, once longer than 64 bytes, and PostgreSQL cut it to the table's
// own, and took the table for the index.
func TestLongestTableNameGetsItsTableAndIndex(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_"+strings.Repeat("n", 63-len("idem_")-len("_01234567")))
		require.Len(t, table, 63)
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		require.NoError(t, m.Ready(t.Context()))
		srv, runs := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "k").StatusCode)
		replay := post(t, srv, "k")
		require.Equal(t, "true", replay.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 1, runs.Load())

		var indexes int
		var err error
		switch d.Kind {
		case sqltest.PostgreSQL:
			err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(record_until)%'", table).Scan(&indexes)
		case sqltest.MySQL:
			err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'record_until'", table).Scan(&indexes)
		default:
			err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql LIKE '%(record_until)%'", table).Scan(&indexes)
		}
		require.NoError(t, err)
		require.Equal(t, 1, indexes, "the index on record_until that the purge reads")
	})
}
