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
	"strings"
	"time"

	"github.com/onceonly/idempotency/sqldialect"
)

// ended reports whether the database ended conn under a statement that
// failed with err: the server terminated it, a restart or the network cut
// it. Its transaction then committed nothing, and the failure is the
// database's, not the work's. A work's own failure must stay its own (its
// answer goes to the client): an error of its own, its own timeout (whose
// cancelled statement a driver answers by closing the connection), or a
// failure of another connection it made (another database, dblink, a
// foreign table), which reports the same errors as this one would. So
// both must hold:
//
//   - err is what a connection's end gives (endedKind), and not a
//     context's end, which is the work's own;
//   - conn is gone (gone): database/sql closed it, its driver says so, or
//     it fails a ping.
//
// Anything else is the work's, whatever became of the connection.
func ended(ctx context.Context, conn *sql.Conn, err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case !endedKind(err):
		return false
	}
	return gone(ctx, conn)
}

// endedKind reports whether err is of the kind a connection's end gives:
// driver.ErrBadConn; one that closed mid-reply (an EOF) or a net.Error;
// go-sql-driver's ErrInvalidConn; a server ending a session (PostgreSQL's
// FATAL or PANIC, a connection's SQLSTATE, class 08 or 57P01 to 57P03;
// MySQL's 1927, a connection killed, or 1053, a server shutting down).
func endedKind(err error) bool {
	var netErr net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &netErr) || invalidConnection(err) {
		return true
	}
	e, ok := sqldialect.ErrorOf(err)
	switch {
	case !ok:
		return false
	case e.MySQL == mysqlConnectionKilled, e.MySQL == mysqlServerShutdown:
		return true
	case strings.HasPrefix(e.SQLState, "08"), e.SQLState == "57P01", e.SQLState == "57P02", e.SQLState == "57P03":
		return true
	}
	severity := severityOf(err)
	return severity == "FATAL" || severity == "PANIC"
}

// MySQL's error numbers for a connection it ended.
const (
	mysqlServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	mysqlConnectionKilled = 1927 // ER_CONNECTION_KILLED
)

// gone reports whether conn can no longer run a statement: database/sql
// closed it (over driver.ErrBadConn), its driver says so
// (driver.Validator: go-sql-driver/mysql), or, where the driver cannot
// tell (pgx, which marks a connection closed and fails its ping at once),
// it fails a ping within endedPing. A ping that runs out of time says
// nothing: the database is slow, not gone.
func gone(ctx context.Context, conn *sql.Conn) bool {
	asked, alive := false, true
	if conn.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok {
			asked, alive = true, v.IsValid()
		}
		return nil
	}) != nil {
		return true
	}
	if asked {
		return !alive
	}
	ping, cancel := context.WithTimeout(ctx, endedPing)
	defer cancel()
	return conn.PingContext(ping) != nil && ping.Err() == nil
}

// endedPing bounds gone's ping.
const endedPing = 250 * time.Millisecond

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
