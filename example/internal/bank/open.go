package bank

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // postgres:// URLs
	"github.com/onceonly/idempotency/sqlidem"
	_ "modernc.org/sqlite" // pure Go: a bare machine has no C compiler
)

// Open opens the database that databaseURL names:
//
//	postgres://user:password@host:5432/dbname?sslmode=disable   PostgreSQL (pgx)
//	mysql://user:password@tcp(host:3306)/dbname                  MySQL or MariaDB
//
// The MySQL form is go-sql-driver/mysql's DSN behind a mysql:// scheme, as
// golang-migrate writes it. With no databaseURL, it opens (or creates) the
// SQLite file at sqlitePath.
func Open(databaseURL, sqlitePath string) (*sql.DB, sqlidem.Dialect, error) {
	driver, dsn, dialect := "sqlite", SQLiteDSN(sqlitePath), sqlidem.SQLite
	switch {
	case databaseURL == "":
		if sqlitePath == "" {
			return nil, 0, errors.New("no database: name a DATABASE_URL or a SQLite file")
		}
	case strings.HasPrefix(databaseURL, "postgres://"), strings.HasPrefix(databaseURL, "postgresql://"):
		driver, dsn, dialect = "pgx", databaseURL, sqlidem.PostgreSQL
	case strings.HasPrefix(databaseURL, "mysql://"):
		dsn = strings.TrimPrefix(databaseURL, "mysql://")
		// Checked here so that a mistake is named at start-up, without
		// quoting the URL, which may hold a password.
		if _, err := mysql.ParseDSN(dsn); err != nil {
			return nil, 0, errors.New("DATABASE_URL: a mysql:// URL is mysql://user:password@tcp(host:port)/dbname")
		}
		driver, dialect = "mysql", sqlidem.MySQL
	default:
		return nil, 0, errors.New("DATABASE_URL must start with postgres:// or mysql://")
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, 0, fmt.Errorf("opening the %v database: %w", dialect, err)
	}
	db.SetMaxOpenConns(16)
	return db, dialect, nil
}

// SQLiteDSN is the DSN of a SQLite file that several connections, and
// several processes, write in turn: WAL and a busy timeout make a writer
// wait rather than fail with SQLITE_BUSY, and _txlock=immediate takes the
// write lock at BEGIN, so that two transactions never deadlock upgrading
// their read locks.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}
