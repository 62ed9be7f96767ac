package sqltest

import (
	"net/url"
	"regexp"
	"strings"
)

// Server is the address (host:port) of the database's server, which a
// test may put a proxy in front of; "" for SQLite, which has none.
func (d *DB) Server() string {
	switch d.Kind {
	case PostgreSQL:
		if u, err := url.Parse(d.DSN); err == nil {
			return u.Host
		}
	case MySQL:
		if at := mysqlAddr.FindStringSubmatch(d.DSN); at != nil {
			return at[1]
		}
	}
	return ""
}

// Through is d's DSN with its server's address replaced by addr (a
// proxy's): the same database, user and settings, reached another way.
// It returns d's DSN unchanged when d has no server.
func (d *DB) Through(addr string) string {
	switch d.Kind {
	case PostgreSQL:
		if u, err := url.Parse(d.DSN); err == nil {
			u.Host = addr
			return u.String()
		}
	case MySQL:
		if at := mysqlAddr.FindStringSubmatch(d.DSN); at != nil {
			return strings.Replace(d.DSN, at[0], "tcp("+addr+")", 1)
		}
	}
	return d.DSN
}

// mysqlAddr finds the server in a go-sql-driver DSN: user@tcp(host:port)/db.
var mysqlAddr = regexp.MustCompile(`tcp\(([^)]*)\)`)
