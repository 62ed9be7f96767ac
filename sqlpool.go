package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strconv"

	"github.com/onceonly/idempotency/sqldialect"
)

// sqlConn is what a store operation runs its statements on: db, that is
// its pool, or one connection of it (*sql.Conn).
type sqlConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// poolFull reports whether every connection db may open is in use, and
// how many are.
func poolFull(db *sql.DB) (full bool, inUse int) {
	st := db.Stats()
	return st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections, st.InUse
}

// poolNamed names db's pool in err when err is a statement that ran out of
// time with every connection of the pool in use: it may never have reached
// the database, whose connections were all held, by handlers'
// transactions or by statements that the database is slow to answer.
func poolNamed(db *sql.DB, err error) error {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if full, inUse := poolFull(db); full {
		return &poolFullError{inUse: inUse, err: err}
	}
	return err
}

// A poolFullError is a statement that waited for a connection of a full
// pool until it ran out of time.
type poolFullError struct {
	inUse int
	err   error
}

func (e *poolFullError) Error() string {
	return "no connection of db's pool came free (" + strconv.Itoa(e.inUse) + " in use, SetMaxOpenConns): " + e.err.Error()
}

func (e *poolFullError) Unwrap() error { return e.err }

// broken reports whether c can no longer run a statement: the server
// closed it, a statement was cut mid-way, or its driver says so.
func broken(c *sql.Conn) bool {
	err := c.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok && !v.IsValid() {
			return driver.ErrBadConn
		}
		return nil
	})
	return err != nil
}

// connectionEnded reports whether err is PostgreSQL saying it ended the
// connection (57P01-57P03: its backend terminated by an administrator, a
// crash, a server stopping or starting), which pgx may not have marked
// closed yet: the statement did not run, or rolled back with the backend,
// and nothing more runs on the connection.
func connectionEnded(err error) bool {
	e, ok := sqldialect.ErrorOf(err)
	return ok && (e.SQLState == "57P01" || e.SQLState == "57P02" || e.SQLState == "57P03")
}

// gone reports whether c, a statement on which failed with err, can run no
// more: the server ended it, or it is broken.
func gone(c *sql.Conn, err error) bool {
	return err != nil && (connectionEnded(err) || broken(c))
}
