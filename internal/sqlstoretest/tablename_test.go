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

		require.Equal(t, 1, recordUntilIndexes(t, d, table), "the index on record_until that the purge reads")
	})
}

// A table deployed with its index under the name an earlier version gave
// it (PostgreSQL cut a long one to 63 bytes; SQLite keeps any length) is
// not indexed a second time: each write would keep two indexes.
func TestADeployedTablesIndexIsNotMadeTwice(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.MySQL {
			t.Skip("MySQL creates the index with its table, once")
		}
		table := d.Table(t, "idem_"+strings.Repeat("d", 60-len("idem_")-len("_01234567")))
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		require.NoError(t, m.Ready(t.Context()))
		require.Equal(t, 1, recordUntilIndexes(t, d, table))
		// As an earlier version left it: the index under its old name.
		var name string
		switch d.Kind {
		case sqltest.PostgreSQL:
			require.NoError(t, d.QueryRowContext(t.Context(), "SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(record_until)%'", table).Scan(&name))
		default:
			require.NoError(t, d.QueryRowContext(t.Context(), "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql LIKE '%(record_until)%'", table).Scan(&name))
		}
		_, err := d.ExecContext(t.Context(), `DROP INDEX "`+name+`"`)
		require.NoError(t, err)
		_, err = d.ExecContext(t.Context(), `CREATE INDEX "`+table+`_until" ON `+table+` (record_until)`)
		require.NoError(t, err)

		again := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		require.NoError(t, again.Ready(t.Context()))
		srv, _ := shop(t, again)
		require.Equal(t, http.StatusCreated, post(t, srv, "k").StatusCode)
		require.Equal(t, 1, recordUntilIndexes(t, d, table), "the deployed index, and no second one")
	})
}

// recordUntilIndexes counts table's indexes on record_until.
func recordUntilIndexes(t *testing.T, d *sqltest.DB, table string) int {
	var n int
	var err error
	switch d.Kind {
	case sqltest.PostgreSQL:
		err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(record_until)%'", table).Scan(&n)
	case sqltest.MySQL:
		err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'record_until'", table).Scan(&n)
	default:
		err = d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql LIKE '%(record_until)%'", table).Scan(&n)
	}
	require.NoError(t, err)
	return n
}
