package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqlidem"
	_ "modernc.org/sqlite" // registers "sqlite"; pure Go, so no C compiler is needed
)

// A driverName is what -driver may say: the database it names, and the
// URL scheme of that database.
type driverName struct {
	db     dburl.Database
	scheme string
}

var (
	sqliteDriver   = driverName{dburl.Database{Driver: dburl.SQLite, Dialect: sqlidem.SQLite}, "sqlite:"}
	postgresDriver = driverName{dburl.Database{Driver: dburl.Pgx, Dialect: sqlidem.PostgreSQL}, "postgres"}
	mysqlDriver    = driverName{dburl.Database{Driver: dburl.MySQL, Dialect: sqlidem.MySQL}, "mysql://"}

	driverNames = map[string]driverName{
		"sqlite": sqliteDriver, "postgres": postgresDriver, "postgresql": postgresDriver, "pgx": postgresDriver,
		"mysql": mysqlDriver, "mariadb": mysqlDriver,
	}
)

// databaseOf reads -db and -driver. Without -driver, the URL names the
// database as it does for the example service (internal/sqltest/dburl): -db
// defaults to $DATABASE_URL, so the service's environment serves both.
// -driver names it for a DSN without such a scheme, or one whose scheme
// says otherwise.
func databaseOf(dsn, driver string) (dburl.Database, error) {
	d, err := dburl.Parse(dsn)
	if driver == "" {
		switch {
		case errors.Is(err, dburl.ErrUnknownScheme):
			return d, usagef("cannot tell the database from -db; pass -driver sqlite, postgres or mysql")
		case err != nil:
			return d, usagef("-db: %v", err)
		}
		return d, checked(d, "-db")
	}
	named, ok := driverNames[driver]
	if !ok {
		return dburl.Database{}, usagef("-driver %q: use sqlite, postgres or mysql", driver)
	}
	forced := named.db
	if err == nil && d.Dialect == forced.Dialect {
		return d, checked(d, "-db")
	}
	if err != nil && !errors.Is(err, dburl.ErrUnknownScheme) && strings.HasPrefix(dsn, named.scheme) {
		// The URL says the same database, but does not parse: its error,
		// never the raw string, which a driver would quote back.
		return dburl.Database{}, usagef("-db: %v", err)
	}
	forced.DSN = dsn
	return forced, checked(forced, "-db")
}

// checked parses a MySQL DSN once, so that a bad parameter is a usage
// error now rather than a failure to connect; flag names the flag that
// gave it. go-sql-driver's errors quote a parameter or the database name,
// never the password.
func checked(d dburl.Database, flag string) error {
	if d.Driver != dburl.MySQL {
		return nil
	}
	if _, err := mysql.ParseDSN(d.DSN); err != nil {
		return usagef("%s: %v; a mysql:// URL is mysql://user:password@host:port/dbname "+
			"or mysql://user:password@tcp(host:port)/dbname", flag, err)
	}
	return nil
}

// sqliteFileExists refuses a SQLite database file that is not there: the
// driver would create an empty one, and a mistyped path would leave a
// file behind and fail with "no such table" instead of naming the path.
func sqliteFileExists(d dburl.Database, flag string) error {
	if d.Driver != dburl.SQLite {
		return nil
	}
	dsn := d.DSN
	path, _, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	if path == "" || path == ":memory:" || strings.HasPrefix(dsn, "file::memory:") {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s: no SQLite database at %s: %w", flag, path, err)
	}
	return nil
}
