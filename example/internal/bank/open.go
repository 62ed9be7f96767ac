package bank

import (
	"database/sql"
	"errors"
	"fmt"

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
	d, err := dburl.Parse(databaseURL)
	switch {
	case errors.Is(err, dburl.ErrUnknownScheme), err == nil && d.Dialect == sqlidem.SQLite:
		// A SQLite file is DB_PATH's, so that it gets dburl.SQLiteDSN's options.
		return dburl.Database{}, errors.New("DATABASE_URL must start with postgres:// or mysql://")
	case err != nil:
		return dburl.Database{}, fmt.Errorf("DATABASE_URL: %w", err)
	case d.Dialect == sqlidem.MySQL:
		// Checked here so that a mistake is named at start-up.
		if _, err := mysql.ParseDSN(d.DSN); err != nil {
			return dburl.Database{}, errors.New("DATABASE_URL: a mysql:// URL is mysql://user:password@tcp(host:port)/dbname " +
				"or mysql://user:password@host:port/dbname")
		}
	}
	return d, nil
}
