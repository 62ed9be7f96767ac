package sqldialect

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Stand-ins with the shapes of the drivers' errors (the drivers live in
// internal/sqltest's module; the SQL tests meet the real ones).
type pgError struct{ code string }

func (e *pgError) Error() string    { return "pg: " + e.code }
func (e *pgError) SQLState() string { return e.code }

type MySQLError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

type sqliteError struct{ code int }

func (e *sqliteError) Error() string { return fmt.Sprint("sqlite: ", e.code) }
func (e *sqliteError) Code() int     { return e.code }

func TestErrorOf(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		want      DBError
		ok        bool
		retryable bool
	}{
		{"postgres serialization failure", &pgError{"40001"}, DBError{SQLState: "40001"}, true, true},
		{"postgres deadlock, wrapped", fmt.Errorf("tx: %w", &pgError{"40P01"}), DBError{SQLState: "40P01"}, true, true},
		{"postgres unique violation", &pgError{"23505"}, DBError{SQLState: "23505"}, true, false},
		{"mysql deadlock", &MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}}, DBError{SQLState: "40001", MySQL: 1213}, true, true},
		{"mysql deadlock without a state", &MySQLError{Number: 1213}, DBError{MySQL: 1213}, true, true},
		{"mysql duplicate key, joined", errors.Join(errors.New("insert"), &MySQLError{Number: 1062}), DBError{MySQL: 1062}, true, false},
		{"sqlite busy snapshot", &sqliteError{517}, DBError{SQLite: 517}, true, true},
		{"sqlite busy", &sqliteError{5}, DBError{SQLite: 5}, true, true},
		{"sqlite constraint", &sqliteError{2067}, DBError{SQLite: 2067}, true, false},
		{"a broken connection", driver.ErrBadConn, DBError{}, false, false},
		{"nil", nil, DBError{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ErrorOf(tc.err)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.retryable, Retryable(tc.err))
		})
	}
	require.True(t, DuplicateIndex(&MySQLError{Number: 1061}))
	require.False(t, DuplicateIndex(&pgError{"42P07"}))
}
