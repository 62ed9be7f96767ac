package sqlstoretest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// What a key costs the database, in statements (each a round trip: a
// query, an exec, a BEGIN or a COMMIT): the SQL store's budget, as the
// round-trip budget test holds Redis's.
//
//	first execution  2: the INSERT that claims the key (and, on MySQL,
//	                    which has no RETURNING, a SELECT of its fence),
//	                    and the UPDATE that stores its answer
//	duplicate        2: the INSERT that finds the key's row, and one
//	                    SELECT of the finished record
func TestStatementsPerKey(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		db, statements := counted(t, d)
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_count")),
			idempotency.WithSharedKeys(), idempotency.WithResponseCache(0, 0))
		srv, runs := shop(t, m)
		// The table exists, and the instance's first purge (once a minute)
		// is done.
		require.Equal(t, http.StatusCreated, post(t, srv, "warm").StatusCode)
		require.Eventually(t, func() bool {
			n := statements.Load()
			time.Sleep(50 * time.Millisecond)
			return statements.Load() == n
		}, 5*time.Second, time.Millisecond)

		before := statements.Load()
		require.Equal(t, http.StatusCreated, post(t, srv, "k").StatusCode)
		first := statements.Load() - before
		before = statements.Load()
		replay := post(t, srv, "k")
		duplicate := statements.Load() - before
		require.Equal(t, "true", replay.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 2, runs.Load())
		t.Logf("%s: %d statements per first execution, %d per duplicate", d.Kind, first, duplicate)
		budget := 2
		if d.Kind == sqltest.MySQL {
			budget = 3
		}
		require.EqualValues(t, budget, first, "statements per first execution")
		require.EqualValues(t, 2, duplicate, "statements per duplicate")
	})
}

// counted opens d's database again, counting the statements sent to it.
func counted(t *testing.T, d *sqltest.DB) (*sql.DB, *atomic.Int64) {
	var connector driver.Connector = dsnConnector{d.DB.Driver(), d.DSN}
	if open, ok := d.DB.Driver().(driver.DriverContext); ok {
		var err error
		connector, err = open.OpenConnector(d.DSN)
		require.NoError(t, err)
	}
	n := new(atomic.Int64)
	db := sql.OpenDB(countingConnector{connector, n})
	t.Cleanup(func() { db.Close() })
	return db, n
}

// dsnConnector connects with a driver that makes no connectors.
type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

type countingConnector struct {
	driver.Connector
	n *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn, c.n}, nil
}

// countingConn counts what goes to the database: a statement run on its
// own, a BEGIN, a COMMIT or a ROLLBACK. A statement the driver runs as
// prepare-execute-close (MySQL without interpolateParams) counts once.
type countingConn struct {
	driver.Conn
	n *atomic.Int64
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.n.Add(1)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.n.Add(1)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{tx, c.n}, nil
}

func (c *countingConn) CheckNamedValue(v *driver.NamedValue) error {
	if check, ok := c.Conn.(driver.NamedValueChecker); ok {
		return check.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if reset, ok := c.Conn.(driver.SessionResetter); ok {
		return reset.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type countingTx struct {
	driver.Tx
	n *atomic.Int64
}

func (t countingTx) Commit() error   { t.n.Add(1); return t.Tx.Commit() }
func (t countingTx) Rollback() error { t.n.Add(1); return t.Tx.Rollback() }
