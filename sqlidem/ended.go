package sqlidem

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"slices"
	"time"

	"github.com/onceonly/idempotency/sqldialect"
)

// ended reports whether the database ended conn under a statement that
// failed with err: the server terminated it, a restart or the network cut
// it. Its transaction then committed nothing, and the failure is the
// database's, not the work's. A work's own failure must stay its own (its
// answer goes to the client), so err must carry the connection's end:
//
//   - a context's end never does: it is the work's own (its own timeout,
//     say, whose cancelled statement a driver answers by closing the
//     connection);
//   - driver.ErrBadConn does, and so does the server ending this session:
//     PostgreSQL's FATAL (57P01, a backend terminated), MySQL's 1927 (a
//     connection killed) or 1053 (a server shutting down). PostgreSQL's
//     other severities do not: an ERROR with a connection's SQLSTATE comes
//     from a connection the work made itself (dblink, a foreign table),
//     and the work's own survives it;
//   - an error of the connection's kind (an EOF, a net.Error,
//     go-sql-driver's "invalid connection") may be the database's or the
//     work's own call to another service: the connection is asked
//     (driver.Validator: go-sql-driver), or, where the driver cannot tell
//     (pgx), pinged, within endedPing; a ping that runs out of time leaves
//     the error the work's.
//
// Anything else (the work's own error, however it answered) is the
// work's, whatever became of the connection.
func ended(ctx context.Context, conn *sql.Conn, err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.Is(err, driver.ErrBadConn), sessionEnded(err):
		return true
	case !connectionKind(err):
		return false
	}
	asked, alive := false, true
	conn.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok {
			asked, alive = true, v.IsValid()
		}
		return nil
	})
	if asked {
		return !alive
	}
	ping, cancel := context.WithTimeout(ctx, endedPing)
	defer cancel()
	return conn.PingContext(ping) != nil && ping.Err() == nil
}

// endedPing bounds ended's ping: a database slower than this to answer it
// leaves the work's error as the work's.
const endedPing = 250 * time.Millisecond

// sessionEnded reports whether err is the server ending the session it
// was sent on.
func sessionEnded(err error) bool {
	e, ok := sqldialect.ErrorOf(err)
	switch {
	case !ok:
		return false
	case e.MySQL == mysqlConnectionKilled || e.MySQL == mysqlServerShutdown:
		return true
	}
	severity := severityOf(err)
	return e.SQLState != "" && (severity == "FATAL" || severity == "PANIC")
}

// MySQL's error numbers for a connection it ended.
const (
	mysqlServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	mysqlConnectionKilled = 1927 // ER_CONNECTION_KILLED
)

// severityOf reads the severity of the PostgreSQL error in err's chain, as
// sqldialect reads drivers' errors without importing them: pgx's
// *pgconn.PgError and lib/pq's *pq.Error keep it in a field (the
// unlocalized one first, where the server sends it).
func severityOf(err error) string {
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) {
		return ""
	}
	v := reflect.ValueOf(pg)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return ""
	}
	for _, name := range []string{"SeverityUnlocalized", "Severity"} {
		if f := v.Elem().FieldByName(name); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
			return f.String()
		}
	}
	return ""
}

// connectionKind reports whether err is of the kind a connection fails
// with: one that closed mid-reply (an EOF), a net.Error, or
// go-sql-driver's ErrInvalidConn.
func connectionKind(err error) bool {
	var netErr net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) ||
		invalidConnection(err)
}

// invalidConnection reports whether err's chain holds go-sql-driver's
// ErrInvalidConn, which has no type of its own to test: by its text.
func invalidConnection(err error) bool {
	for err != nil {
		if err.Error() == "invalid connection" {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			return slices.ContainsFunc(u.Unwrap(), invalidConnection)
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return false
		}
	}
	return false
}
