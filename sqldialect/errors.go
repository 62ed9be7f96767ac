package sqldialect

import "reflect"

// A DBError is what a database answered when it refused a statement, read
// from a driver's error without importing the driver: database/sql users
// bring their own.
type DBError struct {
	// SQLState is the five-character SQLSTATE, when the driver reports one
	// (pgx and lib/pq always; go-sql-driver/mysql for most errors).
	SQLState string
	// MySQL is MySQL's error number; 0 from other databases.
	MySQL int
	// SQLite is SQLite's extended result code; 0 from other databases.
	SQLite int
}

// ErrorOf finds the database's own answer in err's chain: a PostgreSQL
// error (SQLState() string: pgx's *pgconn.PgError, lib/pq's *pq.Error), a
// MySQL error (go-sql-driver's *mysql.MySQLError, read by its fields), or
// a SQLite error (Code() int: modernc.org/sqlite's *sqlite.Error). ok is
// false for everything else: a broken connection, a timeout, a context's
// end, an error of the caller's own.
func ErrorOf(err error) (e DBError, ok bool) {
	for _, err := range chain(err) {
		if s, is := err.(interface{ SQLState() string }); is && len(s.SQLState()) == 5 {
			return DBError{SQLState: s.SQLState()}, true
		}
		if c, is := err.(interface{ Code() int }); is {
			return DBError{SQLite: c.Code()}, true
		}
		if e, is := mysqlError(err); is {
			return e, true
		}
	}
	return DBError{}, false
}

// mysqlError reads go-sql-driver/mysql's *MySQLError{Number uint16,
// SQLState [5]byte}, which has no method to ask.
func mysqlError(err error) (DBError, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "MySQLError" {
		return DBError{}, false
	}
	v = v.Elem()
	number, state := v.FieldByName("Number"), v.FieldByName("SQLState")
	if !number.IsValid() || !number.CanUint() || !state.IsValid() || state.Kind() != reflect.Array || state.Len() != 5 {
		return DBError{}, false
	}
	e := DBError{MySQL: int(number.Uint())}
	var s [5]byte
	for i := range s {
		s[i] = byte(state.Index(i).Uint())
	}
	if s != [5]byte{} {
		e.SQLState = string(s[:])
	}
	return e, true
}

// chain lists err and every error it wraps, depth first.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(err error) {
		for err != nil {
			out = append(out, err)
			switch u := err.(type) {
			case interface{ Unwrap() []error }:
				for _, e := range u.Unwrap() {
					walk(e)
				}
				return
			case interface{ Unwrap() error }:
				err = u.Unwrap()
			default:
				return
			}
		}
	}
	walk(err)
	return out
}

// MySQL error numbers and SQLite result codes read here.
const (
	mysqlDeadlock     = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back
	mysqlChanged      = 1020 // ER_CHECKREAD: the record changed since the snapshot (MariaDB's snapshot isolation)
	mysqlDupKeyName   = 1061 // ER_DUP_KEYNAME: an index of that name exists
	sqliteBusy        = 5    // SQLITE_BUSY and its extended codes (BUSY_SNAPSHOT is 517)
	sqlitePrimaryMask = 0xff
)

// Retryable reports whether err is the database aborting a transaction so
// that it may be run again: a serialization failure (SQLSTATE 40001) or a
// deadlock (40P01; MySQL 1213), or on SQLite a lock that could not be had
// or a snapshot that went stale (SQLITE_BUSY and its extended codes). The
// transaction did not commit, and running it again from BEGIN may succeed.
func Retryable(err error) bool {
	e, ok := ErrorOf(err)
	switch {
	case !ok:
		return false
	case e.SQLState == "40001", e.SQLState == "40P01", e.MySQL == mysqlDeadlock, e.MySQL == mysqlChanged:
		return true
	}
	return e.SQLite&sqlitePrimaryMask == sqliteBusy
}

// DuplicateIndex reports whether err is MySQL refusing to create an index
// whose name is taken.
func DuplicateIndex(err error) bool {
	e, ok := ErrorOf(err)
	return ok && e.MySQL == mysqlDupKeyName
}
