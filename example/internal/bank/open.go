package bank

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // postgres:// URLs
	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqlidem"
	_ "modernc.org/sqlite" // pure Go: a bare machine has no C compiler
)

// Open opens the database that databaseURL names:
//
//	postgres://user:password@host:5432/dbname?sslmode=disable   PostgreSQL (pgx)
//	mysql://user:password@tcp(host:3306)/dbname                  MySQL or MariaDB
//	mysql://user:password@host:3306/dbname                       the same
//
// The first MySQL form is go-sql-driver/mysql's DSN behind a mysql://
// scheme, as golang-migrate writes it; the second is a URL, whose
// password's special characters are percent-encoded. idemctl reads
// DATABASE_URL the same way (internal/sqltest/dburl). With no databaseURL, it
// opens (or creates) the SQLite file at sqlitePath.
func Open(databaseURL, sqlitePath string) (*sql.DB, sqlidem.Dialect, error) {
	d, err := source(databaseURL, sqlitePath)
	if err != nil {
		return nil, 0, err
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		return nil, 0, fmt.Errorf("opening the %v database: %w", d.Dialect, err)
	}
	db.SetMaxOpenConns(16)
	return db, d.Dialect, nil
}

// source names the driver and DSN of Open's database. Its errors never
// quote the URL, which may hold a password.
func source(databaseURL, sqlitePath string) (dburl.Database, error) {
	if databaseURL == "" {
		if sqlitePath == "" {
			return dburl.Database{}, errors.New("no database: name a DATABASE_URL or a SQLite file")
		}
		return dburl.Database{Driver: dburl.SQLite, DSN: dburl.SQLiteDSN(sqlitePath), Dialect: sqlidem.SQLite}, nil
	}
	d, err := ParseURL("DATABASE_URL", databaseURL)
	if errors.Is(err, dburl.ErrUnknownScheme) || err == nil && d.Dialect == sqlidem.SQLite {
		// A SQLite file is DB_PATH's.
		return dburl.Database{}, errors.New("DATABASE_URL must start with postgres:// or mysql://")
	}
	return d, err
}

// ParseURL reads the database URL that the environment variable name
// holds, as dburl.Parse does: postgres://, mysql:// (in the forms Open
// lists), or sqlite:PATH, a SQLite file that gets dburl.SQLiteDSN's
// options. A URL of no such scheme (file: included) is an error matching
// dburl.ErrUnknownScheme. Its errors name the variable and never quote the
// URL, which may hold a password.
func ParseURL(name, raw string) (dburl.Database, error) {
	d, err := dburl.Parse(raw)
	switch {
	case errors.Is(err, dburl.ErrUnknownScheme), err == nil && strings.HasPrefix(strings.ToLower(raw), "file:"):
		return dburl.Database{}, schemeError(name)
	case err != nil:
		return dburl.Database{}, fmt.Errorf("%s: %w", name, err)
	case d.Dialect == sqlidem.SQLite:
		if d.DSN == "" {
			return dburl.Database{}, errors.New(name + ": sqlite: names no file; write sqlite:/path/to/file.db")
		}
		d.DSN = dburl.SQLiteDSN(d.DSN)
	case d.Dialect == sqlidem.MySQL:
		// Checked here so that a mistake is named at start-up.
		if _, err := mysql.ParseDSN(d.DSN); err != nil {
			return dburl.Database{}, errors.New(name + ": a mysql:// URL is mysql://user:password@tcp(host:port)/dbname " +
				"or mysql://user:password@host:port/dbname")
		}
	}
	return d, nil
}

// schemeError is ParseURL's error for a URL of no scheme it reads, named
// by its variable.
type schemeError string

func (e schemeError) Error() string {
	return string(e) + " must start with postgres://, mysql:// or sqlite:"
}

func (e schemeError) Unwrap() error { return dburl.ErrUnknownScheme }
