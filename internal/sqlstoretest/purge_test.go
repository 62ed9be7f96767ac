package sqlstoretest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// An instance purges expired rows by itself, batch after batch while
// batches come back full: 2,500 expired rows go in one purge (three
// batches), and a key whose record still lives stays, and replays.
func TestPurgeKeepsPaceAndSparesLiveRecords(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_purge")
		live := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		srv, runs := shop(t, live)
		require.Equal(t, http.StatusCreated, post(t, srv, "live").StatusCode)

		// Rows with neither a record nor a lease: what released keys and
		// expired records leave.
		const expired = 2500
		var values []string
		var args []any
		for i := range expired {
			values = append(values, "(?)")
			args = append(args, fmt.Sprint("expired-", i))
		}
		_, err := d.ExecContext(t.Context(), d.Dialect.Bind("INSERT INTO "+table+" (id) VALUES "+strings.Join(values, ", ")), args...)
		require.NoError(t, err)

		// Another instance's first reach of the table starts its purge.
		purger := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		require.NoError(t, purger.Ready(t.Context()))
		require.Eventually(t, func() bool {
			var n int
			err := d.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+table).Scan(&n)
			return err == nil && n == 1
		}, 30*time.Second, 50*time.Millisecond, "every expired row purged, the live one kept")

		replay := post(t, srv, "live")
		require.Equal(t, http.StatusCreated, replay.StatusCode)
		require.Equal(t, "true", replay.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 1, runs.Load())
	})
}
