package peer

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
)

// The servers on PostgreSQL count what they send to the database at the
// driver, as internal/sqlstoretest counts the SQL store's statements: a
// query or an exec run on its own, a BEGIN, a COMMIT, a ROLLBACK, each one
// round trip. Every server's pool is configured alike: at most 64
// connections, all of them kept when idle (database/sql keeps 2 by
// default, and 16 connections' worth of load would open and close one per
// request).

// PoolSize is the most connections a server's pool opens and keeps.
const PoolSize = 64

var (
	statements atomic.Int64
	byVerbMu   sync.Mutex
	byVerb     = map[string]int64{}
)

// countStatement counts one statement, by its first word (BEGIN and
// COMMIT are named for what they are).
func countStatement(verb string) {
	statements.Add(1)
	byVerbMu.Lock()
	byVerb[verb]++
	byVerbMu.Unlock()
}

func verbOf(query string) string {
	query = strings.TrimSpace(query)
	verb, _, _ := strings.Cut(query, " ")
	verb, _, _ = strings.Cut(verb, "\n")
	return strings.ToUpper(verb)
}

// statementCounts returns the statements sent so far, in all and by verb.
func statementCounts() (int64, map[string]int64) {
	byVerbMu.Lock()
	defer byVerbMu.Unlock()
	verbs := make(map[string]int64, len(byVerb))
	for v, n := range byVerb {
		verbs[v] = n
	}
	return statements.Load(), verbs
}

// OpenCounted opens a database through drv, whose DSN is dsn, counting
// the statements sent to it, with the pool every server uses.
func OpenCounted(drv driver.Driver, dsn string) *sql.DB {
	var connector driver.Connector = dsnConnector{drv, dsn}
	if open, ok := drv.(driver.DriverContext); ok {
		c, err := open.OpenConnector(dsn)
		if err != nil {
			log.Fatal(err)
		}
		connector = c
	}
	db := sql.OpenDB(countingConnector{connector})
	db.SetMaxOpenConns(PoolSize)
	db.SetMaxIdleConns(PoolSize)
	return db
}

// MustLoopbackDSN refuses a PostgreSQL URL whose host is not loopback.
func MustLoopbackDSN(dsn string) {
	u, err := url.Parse(dsn)
	if err != nil {
		log.Fatalf("-postgres: %v", err)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		log.Fatalf("-postgres: %s is not a loopback address", host)
	}
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

type countingConnector struct{ driver.Connector }

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn}, nil
}

// countingConn passes everything on to the driver's connection and counts
// the statements. A statement the driver prepares and then executes
// counts once.
type countingConn struct{ driver.Conn }

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	countStatement(verbOf(q))
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	countStatement(verbOf(q))
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	countStatement("BEGIN")
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{tx}, nil
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

func (c *countingConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type countingTx struct{ driver.Tx }

func (t countingTx) Commit() error   { countStatement("COMMIT"); return t.Tx.Commit() }
func (t countingTx) Rollback() error { countStatement("ROLLBACK"); return t.Tx.Rollback() }
