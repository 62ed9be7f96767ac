package sqlidem

import (
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

// Only the server ending this session is the database's: not the same
// SQLSTATE at another severity, which a work's own connection (dblink, a
// foreign table) relays.
func TestSessionEnded(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgError{Code: "57P01", Severity: "FATAL"}, true},
		{fmt.Errorf("paying: %w", &pgError{Code: "57P01", Severity: "FATAL", SeverityUnlocalized: "FATAL"}), true},
		{&pgError{Code: "57P01", Severity: "ERROR"}, false},
		{&pgError{Code: "08001", Severity: "ERROR"}, false},
		{&pgError{Code: "08006", Severity: "FATAL"}, true},
		{&pgError{Code: "08006", Severity: "FATAL", SeverityUnlocalized: "ERROR"}, false},
		{&MySQLError{Number: 1927}, true},
		{&MySQLError{Number: 1053}, true},
		{&MySQLError{Number: 1062}, false},
		{errors.New("could not verify"), false},
	} {
		if got := sessionEnded(tc.err); got != tc.want {
			t.Errorf("sessionEnded(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Errors of a connection's kind are asked about; a work's own are not.
func TestConnectionKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("paying: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true},
		{fmt.Errorf("paying: %w", errors.New("invalid connection")), true},
		{errors.Join(errors.New("rates"), errors.New("invalid connection")), true},
		{errors.New("could not verify"), false},
		{errors.New("an invalid connection string"), false},
	} {
		if got := connectionKind(tc.err); got != tc.want {
			t.Errorf("connectionKind(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
