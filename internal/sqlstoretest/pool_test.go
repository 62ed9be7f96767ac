package sqlstoretest

import (
	"bytes"
	"database/sql"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// NewSQL on a pool with no limit says so once, at start: uncapped, a burst
// of new keys opens a connection per request, and the server refuses those
// past its limit while it is healthy (387 of 400 answered 503 at once on
// PostgreSQL's 100 connections; none with a pool of 16). A capped pool is
// not mentioned.
func TestAnUncappedPoolIsLoggedAtStart(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite) // capped at 16
	uncapped, err := sql.Open(d.Driver, d.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { uncapped.Close() })
	for _, c := range []struct {
		db   *sql.DB
		told int
	}{{uncapped, 1}, {d.DB, 0}} {
		var log bytes.Buffer
		idempotency.NewSQL(c.db, d.Dialect, idempotency.WithSharedKeys(),
			idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
		require.Equal(t, c.told, strings.Count(log.String(), "SetMaxOpenConns"), "log: %s", log.String())
	}
}
