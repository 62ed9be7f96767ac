// Package dburl reads the database URLs that the example service and
// idemctl take from DATABASE_URL, so that an operator who reuses the
// service's environment for idemctl reaches the same database. It names
// the database/sql driver and its DSN and imports no driver: each program
// registers the drivers it links.
package dburl

import (
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/onceonly/idempotency/sqldialect"
)

// The database/sql driver names a Database may hold.
const (
	Pgx    = "pgx"    // github.com/jackc/pgx/v5/stdlib
	MySQL  = "mysql"  // github.com/go-sql-driver/mysql
	SQLite = "sqlite" // modernc.org/sqlite
)

// A Database is what a URL names: a driver, its DSN and the SQL dialect.
type Database struct {
	Driver, DSN string
	Dialect     sqldialect.Dialect
}

// ErrUnknownScheme is returned for a URL that starts with none of the
// schemes Parse knows (a bare DSN, for instance).
var ErrUnknownScheme = errors.New("dburl: the URL starts with none of postgres://, postgresql://, mysql://, sqlite: and file:")

// Parse reads a database URL:
//
//	postgres://… and postgresql://…                PostgreSQL; the URL is pgx's DSN
//	mysql://user:password@tcp(host:3306)/db?params  MySQL; go-sql-driver's DSN behind the scheme
//	mysql://user:password@host:3306/db?params       MySQL; rewritten into go-sql-driver's DSN
//	sqlite:PATH, sqlite://PATH                      SQLite; PATH is the DSN
//	file:PATH?params                                SQLite; the URL is the DSN
//
// In the second MySQL form the user and password are percent-decoded, as
// in any URL, and the port defaults to 3306; the first is passed on as it
// is written. Schemes are case-insensitive. Errors never quote the URL,
// which may hold a password.
func Parse(raw string) (Database, error) {
	scheme, rest, _ := strings.Cut(raw, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		if strings.HasPrefix(rest, "//") {
			return Database{Pgx, raw, sqldialect.PostgreSQL}, nil
		}
	case "mysql":
		if rest, ok := strings.CutPrefix(rest, "//"); ok {
			dsn, err := mysqlDSN(rest)
			return Database{MySQL, dsn, sqldialect.MySQL}, err
		}
	case "sqlite":
		return Database{SQLite, strings.TrimPrefix(rest, "//"), sqldialect.SQLite}, nil
	case "file":
		return Database{SQLite, raw, sqldialect.SQLite}, nil
	}
	return Database{}, ErrUnknownScheme
}

// mysqlDSN turns a mysql:// URL, without its scheme, into go-sql-driver's
// DSN, [user[:password]@][net(addr)]/dbname[?params].
func mysqlDSN(rest string) (string, error) {
	if driverForm(rest) {
		return rest, nil
	}
	u, err := url.Parse("mysql://" + rest)
	if err != nil {
		// Not even url.Parse's inner message: it quotes a part of the URL
		// (`invalid port ":sec" after host`), which may be the password's
		// start when it holds an un-encoded / ? or #.
		return "", errors.New("dburl: a mysql:// URL is mysql://user:password@host:port/dbname " +
			"or mysql://user:password@tcp(host:port)/dbname; this one does not parse (is a /, ? or # " +
			"of the password not percent-encoded?)")
	}
	db := strings.TrimPrefix(u.EscapedPath(), "/")
	switch {
	case u.Fragment != "":
		return "", errors.New("dburl: a mysql:// URL has no #fragment; write a # of the password as %23")
	case strings.Contains(db, "/"):
		return "", errors.New("dburl: a mysql:// URL's database name has no /")
	case strings.Contains(u.User.Username(), ":"):
		return "", errors.New("dburl: go-sql-driver cannot take a MySQL user name with a colon")
	}
	var b strings.Builder
	if u.User != nil {
		// go-sql-driver splits the user from the password at the first
		// colon and ends the password at the last @ before the address,
		// so the password needs no escaping there.
		b.WriteString(u.User.Username())
		if pw, ok := u.User.Password(); ok {
			b.WriteString(":" + pw)
		}
		b.WriteString("@")
	}
	if u.Host != "" {
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		b.WriteString("tcp(" + addr + ")")
	}
	b.WriteString("/" + db)
	if u.RawQuery != "" {
		b.WriteString("?" + u.RawQuery)
	}
	return b.String(), nil
}

// driverForm reports whether rest is written in go-sql-driver's own form,
// with an address net(addr) right after the user info, if there is any,
// and before the slash of the database name. A URL's host never holds a
// parenthesis; one in a password or in the parameters is preceded by more
// than a network's name, or the address does not end there.
func driverForm(rest string) bool {
	for i, c := range rest {
		if c != '(' {
			continue
		}
		network := rest[strings.LastIndexByte(rest[:i], '@')+1 : i]
		end := strings.IndexByte(rest[i:], ')')
		if network != "" && isWord(network) && end > 0 &&
			i+end+1 < len(rest) && rest[i+end+1] == '/' {
			return true
		}
	}
	return false
}

func isWord(s string) bool {
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// SQLiteDSN is the DSN of a SQLite file that several connections, and
// several processes, write in turn: WAL and a busy timeout make a writer
// wait rather than fail with SQLITE_BUSY, and _txlock=immediate takes the
// write lock at BEGIN, so that two transactions never deadlock upgrading
// their read locks.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}
