package sqlidem

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
)

// pgError has what sqldialect and severityOf read of pgx's *pgconn.PgError.
type pgError struct{ Code, Severity, SeverityUnlocalized string }

func (e *pgError) Error() string    { return e.Severity + ": " + e.Code }
func (e *pgError) SQLState() string { return e.Code }

// MySQLError has what sqldialect reads of go-sql-driver's *MySQLError.
type MySQLError struct {
	Number   uint16
	SQLState [5]byte
}

func (e *MySQLError) Error() string { return fmt.Sprint("Error ", e.Number) }

// What a connection's end gives is asked about (ended then asks the
// connection); a work's own errors are not.
func TestEndedKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("paying: %w", &pgError{Code: "57P01", Severity: "FATAL"}), true},
		{&pgError{Code: "25P03", Severity: "FATAL", SeverityUnlocalized: "FATAL"}, true},
		{&pgError{Code: "3D000", Severity: "FATAL"}, true}, // another database's refusal: the connection tells them apart
		{&pgError{Code: "08001", Severity: "ERROR"}, true},
		{&pgError{Code: "23505", Severity: "ERROR"}, false},
		{&pgError{Code: "23505", Severity: "FEHLER", SeverityUnlocalized: "ERROR"}, false},
		{&MySQLError{Number: 1927}, true},
		{&MySQLError{Number: 1053}, true},
		{&MySQLError{Number: 1062}, false},
		{fmt.Errorf("paying: %w", driver.ErrBadConn), true},
		{fmt.Errorf("paying: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true},
		{fmt.Errorf("paying: %w", errors.New("invalid connection")), true},
		{errors.Join(errors.New("rates"), errors.New("invalid connection")), true},
		{errors.New("could not verify"), false},
		{errors.New("an invalid connection string"), false},
	} {
		if got := endedKind(tc.err); got != tc.want {
			t.Errorf("endedKind(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
