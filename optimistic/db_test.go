package optimistic

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testDB is one database the SQL helpers run on.
type testDB struct {
	name    string
	dialect Dialect
	db      *sql.DB
}

type backend struct {
	name    string
	dialect Dialect
	envVar  string // empty: always available
	open    func(t *testing.T) *sql.DB
}

var backends = []backend{
	{name: "sqlite", dialect: SQLite, open: openSQLite},
	{name: "postgres", dialect: PostgreSQL, envVar: "POSTGRES_DSN", open: openEnv("pgx", "POSTGRES_DSN")},
	{name: "mysql", dialect: MySQL, envVar: "MYSQL_DSN", open: openEnv("mysql", "MYSQL_DSN")},
	// The same server again, counting matched rather than changed rows: the
	// helpers must read RowsAffected right under both settings.
	{name: "mysql-found-rows", dialect: MySQL, envVar: "MYSQL_DSN", open: openMySQLFoundRows},
}

// eachDB runs fn as one subtest per database: SQLite always, PostgreSQL
// and MySQL/MariaDB when POSTGRES_DSN and MYSQL_DSN name one.
func eachDB(t *testing.T, fn func(t *testing.T, d *testDB)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.envVar != "" {
				if why := unusable(b.envVar); why != "" {
					t.Skip(why)
				}
			}
			fn(t, &testDB{name: b.name, dialect: b.dialect, db: b.open(t)})
		})
	}
}

// openSQLite opens a file database, not an in-memory one: with database/sql
// every pooled connection to ":memory:" is a database of its own. WAL and a
// busy timeout let several connections write in turn instead of failing
// with SQLITE_BUSY, and _txlock=immediate makes a transaction take the
// write lock at BEGIN, so two transactions never deadlock upgrading theirs.
func openSQLite(t *testing.T) *sql.DB {
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := sql.Open("sqlite", "file:"+path+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	return db
}

// drivers names the database/sql driver for each DSN variable.
var drivers = map[string]string{"POSTGRES_DSN": "pgx", "MYSQL_DSN": "mysql"}

var (
	probeMu sync.Mutex
	probed  = map[string]string{}
)

// unusable says why the database envVar names cannot be used, or "" when
// it can. It decides by connecting, once per variable: a port that is open
// proves nothing (another program may listen there, or the server may
// refuse the user, the password or the database), so the note quotes what
// the server answered.
func unusable(envVar string) string {
	probeMu.Lock()
	defer probeMu.Unlock()
	if why, ok := probed[envVar]; ok {
		return why
	}
	why := probe(envVar)
	probed[envVar] = why
	return why
}

func probe(envVar string) string {
	dsn := os.Getenv(envVar)
	if dsn == "" {
		return envVar + " is not set; skipping"
	}
	db, err := sql.Open(drivers[envVar], dsn)
	if err == nil {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = db.PingContext(ctx)
	}
	if err != nil {
		// The DSN itself is not logged: it may hold a password.
		return fmt.Sprintf("%s does not accept a connection (%v); skipping. "+
			"Point %s at a database its user may create tables in to run these tests.", envVar, err, envVar)
	}
	return ""
}

func openEnv(driver, envVar string) func(t *testing.T) *sql.DB {
	return func(t *testing.T) *sql.DB {
		db, err := sql.Open(driver, os.Getenv(envVar))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		require.NoError(t, db.PingContext(t.Context()), "%s is set but the database does not answer", envVar)
		return db
	}
}

func openMySQLFoundRows(t *testing.T) *sql.DB {
	cfg, err := mysql.ParseDSN(os.Getenv("MYSQL_DSN"))
	require.NoError(t, err)
	cfg.ClientFoundRows = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.PingContext(t.Context()))
	return db
}

// createTable creates a table with a unique name and drops it when t ends.
// columns is a list of "name TYPE…" with unquoted names; each is quoted for
// the dialect, so reserved words work.
func (d *testDB) createTable(t *testing.T, columns ...string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "optimistic_" + hex.EncodeToString(b)
	defs := make([]string, len(columns))
	for i, c := range columns {
		col, rest, _ := strings.Cut(c, " ")
		defs[i] = d.dialect.Quote(col) + " " + rest
	}
	_, err := d.db.ExecContext(t.Context(), "CREATE TABLE "+name+" ("+strings.Join(defs, ", ")+")")
	require.NoError(t, err)
	t.Cleanup(func() {
		// t.Context has ended by now.
		if _, err := d.db.ExecContext(context.Background(), "DROP TABLE "+name); err != nil {
			t.Logf("dropping %s: %v", name, err)
		}
	})
	return name
}

// accounts creates the table most tests use, with the given rows
// (id → balance) at version 0, fence 0.
func (d *testDB) accounts(t *testing.T, rows map[int64]int64) Table {
	t.Helper()
	name := d.createTable(t,
		"id BIGINT PRIMARY KEY",
		"balance BIGINT NOT NULL DEFAULT 0",
		"owner VARCHAR(64)",
		"order BIGINT", // a reserved word: only quoting makes it work
		"version BIGINT NOT NULL DEFAULT 0",
		"fence BIGINT NOT NULL DEFAULT 0",
	)
	tbl := Table{Dialect: d.dialect, Name: name}
	for id, balance := range rows {
		d.exec(t, "INSERT INTO "+name+" (id, balance) VALUES (?, ?)", id, balance)
	}
	return tbl
}

// exec runs a statement written with ? placeholders, renumbered for
// PostgreSQL.
func (d *testDB) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	_, err := d.db.ExecContext(t.Context(), d.rebind(query), args...)
	require.NoError(t, err)
}

func (d *testDB) rebind(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString(d.dialect.Placeholder(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// row is what the tests read back from the accounts table.
type row struct {
	balance, version, fence int64
	owner                   sql.NullString
}

func (d *testDB) row(t *testing.T, tbl Table, id int64) row {
	t.Helper()
	var r row
	err := d.db.QueryRowContext(t.Context(),
		d.rebind("SELECT balance, owner, version, fence FROM "+tbl.Name+" WHERE id = ?"), id).
		Scan(&r.balance, &r.owner, &r.version, &r.fence)
	require.NoError(t, err)
	return r
}
