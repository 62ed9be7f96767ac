package main

import (
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/onceonly/idempotency/sqlidem"
	_ "modernc.org/sqlite" // registers "sqlite"; pure Go, so no C compiler is needed
)

// A database is what -db and -driver name: a database/sql driver, its DSN
// and the outcome store's dialect.
type database struct {
	driver, dsn string
	dialect     sqlidem.Dialect
}

// databaseOf reads -db and -driver. Without -driver, a DSN's scheme names
// the database: postgres:// and postgresql:// PostgreSQL, mysql:// MySQL
// (rewritten into go-sql-driver's own form), sqlite: (the rest is a path)
// and file: SQLite.
func databaseOf(dsn, driver string) (database, error) {
	scheme, _, _ := strings.Cut(dsn, ":")
	if driver == "" {
		switch strings.ToLower(scheme) {
		case "postgres", "postgresql":
			driver = "postgres"
		case "mysql":
			driver = "mysql"
		case "sqlite", "file":
			driver = "sqlite"
		default:
			return database{}, usagef("cannot tell the database from -db; pass -driver sqlite, postgres or mysql")
		}
	}
	switch driver {
	case "sqlite":
		if rest, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
			dsn = strings.TrimPrefix(rest, "//")
		}
		return database{driver: "sqlite", dsn: dsn, dialect: sqlidem.SQLite}, nil
	case "postgres", "postgresql", "pgx":
		return database{driver: "pgx", dsn: dsn, dialect: sqlidem.PostgreSQL}, nil
	case "mysql", "mariadb":
		dsn, err := mysqlDSN(dsn)
		if err != nil {
			return database{}, err
		}
		return database{driver: "mysql", dsn: dsn, dialect: sqlidem.MySQL}, nil
	}
	return database{}, usagef("-driver %q: use sqlite, postgres or mysql", driver)
}

// mysqlDSN rewrites mysql://user:password@host:port/db?params into
// go-sql-driver's user:password@tcp(host:port)/db?params; a DSN in that
// form already is returned as it is.
func mysqlDSN(dsn string) (string, error) {
	if !strings.HasPrefix(strings.ToLower(dsn), "mysql://") {
		return dsn, nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", usagef("-db: %v", err)
	}
	c := mysql.NewConfig()
	c.User = u.User.Username()
	c.Passwd, _ = u.User.Password()
	c.Net, c.Addr = "tcp", u.Host
	if u.Port() == "" {
		c.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	c.DBName = strings.TrimPrefix(u.Path, "/")
	out := c.FormatDSN()
	if u.RawQuery != "" {
		sep := "?"
		if strings.Contains(out, "?") {
			sep = "&"
		}
		// Parsed once more, so that a bad parameter is a usage error now.
		parsed, err := mysql.ParseDSN(out + sep + u.RawQuery)
		if err != nil {
			return "", usagef("-db: %v", err)
		}
		out = parsed.FormatDSN()
	}
	return out, nil
}
