// Package sqltest gives tests the SQL databases they run on: SQLite always
// (pure Go, in a temporary file), PostgreSQL and MySQL/MariaDB when
// POSTGRES_DSN and MYSQL_DSN name a server that accepts a connection. A
// database that does not is skipped with the server's own answer.
//
// It is a module of its own, so that the drivers stay out of the graph of
// every module whose tests do not need them.
package sqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqldialect"

	_ "github.com/go-sql-driver/mysql" // MYSQL_DSN
	_ "github.com/jackc/pgx/v5/stdlib" // POSTGRES_DSN
	_ "modernc.org/sqlite"             // SQLite, no C compiler needed
)

// Kind names a database server.
type Kind string

const (
	SQLite     Kind = "sqlite"
	PostgreSQL Kind = "postgres"
	MySQL      Kind = "mysql"
)

// A DB is one database a test runs on.
type DB struct {
	Kind Kind
	// Driver and DSN open the database again, in another process too.
	Driver, DSN string
	Dialect     sqldialect.Dialect // the SQL it speaks (sqlidem.Dialect, optimistic.Dialect)
	*sql.DB
}

// Each runs fn as one subtest per database: SQLite always, PostgreSQL and
// MySQL/MariaDB when they accept POSTGRES_DSN and MYSQL_DSN.
func Each(t *testing.T, fn func(t *testing.T, d *DB)) {
	t.Helper()
	for _, kind := range []Kind{SQLite, PostgreSQL, MySQL} {
		t.Run(string(kind), func(t *testing.T) { fn(t, Open(t, kind)) })
	}
}

// Open opens a database of kind for t, or skips t saying why it cannot.
func Open(t testing.TB, kind Kind) *DB {
	t.Helper()
	d := &DB{Kind: kind}
	switch kind {
	case SQLite:
		d.Driver, d.DSN, d.Dialect = dburl.SQLite, dburl.SQLiteDSN(filepath.Join(t.TempDir(), "test.db")), sqldialect.SQLite
	case PostgreSQL:
		d.Driver, d.DSN, d.Dialect = dburl.Pgx, os.Getenv("POSTGRES_DSN"), sqldialect.PostgreSQL
	case MySQL:
		d.Driver, d.DSN, d.Dialect = dburl.MySQL, os.Getenv("MYSQL_DSN"), sqldialect.MySQL
	default:
		t.Fatalf("sqltest: unknown kind %q", kind)
	}
	if kind != SQLite {
		if why := unusable(kind, d.Driver, d.DSN); why != "" {
			t.Skip(why)
		}
		// The test command's summary names the server from this line.
		t.Logf("sqltest: %s server: %s", kind, serverVersion(kind))
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(16)
	t.Cleanup(func() { db.Close() })
	if kind == SQLite {
		// One connection first turns the new file to WAL (the DSN's
		// journal_mode pragma): several connections opening a fresh file
		// at once race for that switch, and the loser gets SQLITE_BUSY
		// without the busy timeout being consulted. WAL mode stays with
		// the file, so later connections find it done.
		if err := db.PingContext(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	d.DB = db
	return d
}

// Table returns a table name no other test uses, prefixed with base, and
// drops the table when t ends.
func (d *DB) Table(t testing.TB, base string) string {
	var b [4]byte
	rand.Read(b[:])
	name := base + "_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
	})
	return name
}

var (
	probeMu  sync.Mutex
	probed   = map[Kind]string{}
	versions = map[Kind]string{} // SELECT version() of each server that accepted its DSN
)

func serverVersion(kind Kind) string {
	probeMu.Lock()
	defer probeMu.Unlock()
	return versions[kind]
}

// unusable says why the server a DSN names cannot be used, or "" when it
// can. It decides by connecting, once per kind: a port that is open proves
// nothing (the server may refuse the user, the password or the database),
// so the note quotes what the server answered, never the DSN itself, which
// may hold a password.
func unusable(kind Kind, driver, dsn string) string {
	probeMu.Lock()
	defer probeMu.Unlock()
	if why, ok := probed[kind]; ok {
		return why
	}
	envVar := map[Kind]string{PostgreSQL: "POSTGRES_DSN", MySQL: "MYSQL_DSN"}[kind]
	why := ""
	if dsn == "" {
		why = envVar + " is not set; skipping"
	} else if v, err := ping(driver, dsn); err == nil {
		versions[kind] = v
	} else {
		why = fmt.Sprintf("%s does not accept a connection (%v); skipping. "+
			"Point %s at a database its user may create tables in to run these tests.", envVar, err, envVar)
	}
	probed[kind] = why
	return why
}

// ping connects, and returns the server's own name for itself.
func ping(driver, dsn string) (string, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var version string
	err = db.QueryRowContext(ctx, "SELECT version()").Scan(&version)
	return version, err
}
