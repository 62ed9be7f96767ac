package sqlidem

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/onceonly/idempotency/sqldialect"
)

// connect takes a connection of db's pool for an execution and runs first
// on it: the execution's statements all run on that one connection, so
// that a work that fails can ask whether the database ended it under the
// work (ended). Like database/sql with its pool's connections, it moves
// past one the server ended while it sat idle (a backend terminated, a
// server restarted), for up to 3 connections.
func (s *Store) connect(ctx context.Context, first func(*sql.Conn) error) (*sql.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		err = first(conn)
		if err == nil {
			return conn, nil
		}
		gone := ended(ctx, conn, err)
		conn.Close()
		if !gone || attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// lookupOnConn reads key's row (lookup) on a connection of its own, which
// it returns for the statements after it (nil when err is set).
func (s *Store) lookupOnConn(ctx context.Context, key string) (conn *sql.Conn, row Row, found bool, err error) {
	conn, err = s.connect(ctx, func(conn *sql.Conn) (err error) {
		row, found, err = s.lookup(ctx, conn, key)
		return err
	})
	return conn, row, found, err
}

// ended reports whether the database ended conn under a statement that
// failed with err: the server terminated it, a restart or the network cut
// it. Its transaction then committed nothing, whatever err says. Without
// a round trip where it can be told so:
//
//   - a context's end is the work's own (its own timeout, say, whose
//     cancelled statement a driver answers by closing the connection):
//     never the database's;
//   - driver.ErrBadConn, a connection exception (SQLSTATE class 08),
//     PostgreSQL ending the backend (57P01 to 57P03) or MySQL killing the
//     connection or shutting down (1927, 1053) are the database's;
//   - a driver that tells whether its connection lives (driver.Validator:
//     go-sql-driver/mysql, whose error is then "invalid connection") is
//     asked.
//
// Only an error of the network's kind (an EOF, a net.Error) from a driver
// that cannot be asked (pgx) costs a ping, bounded by endedPing: it may
// be the work's own call to another service.
func ended(ctx context.Context, conn *sql.Conn, err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.Is(err, driver.ErrBadConn), connectionException(err):
		return true
	}
	asked, alive := false, true
	conn.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok {
			asked, alive = true, v.IsValid()
		}
		return nil
	})
	switch {
	case asked:
		return !alive
	case !networkError(err):
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, endedPing)
	defer cancel()
	return errors.Is(conn.PingContext(ctx), driver.ErrBadConn)
}

// endedPing bounds ended's ping: a database slower than this to answer it
// leaves the work's error as the work's.
const endedPing = 250 * time.Millisecond

// connectionException reports whether err is the database saying that it
// ended the connection.
func connectionException(err error) bool {
	e, ok := sqldialect.ErrorOf(err)
	switch {
	case !ok:
		return false
	case strings.HasPrefix(e.SQLState, "08"), e.SQLState == "57P01", e.SQLState == "57P02", e.SQLState == "57P03":
		return true
	}
	return e.MySQL == mysqlConnectionKilled || e.MySQL == mysqlServerShutdown
}

// MySQL's error numbers for a connection it ended.
const (
	mysqlServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	mysqlConnectionKilled = 1927 // ER_CONNECTION_KILLED
)

// networkError reports whether err is of the network's kind: a connection
// that closed mid-reply, or a net.Error.
func networkError(err error) bool {
	var netErr net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
}
