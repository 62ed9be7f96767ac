package optimistic

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testDB is one database the SQL helpers run on.
type testDB struct {
	name    string
	dialect Dialect
	db      *sql.DB
}

// backends are internal/sqltest's databases (SQLite always, PostgreSQL and
// MySQL/MariaDB when they accept their DSN), and MySQL once more, counting
// matched rather than changed rows: the helpers must read RowsAffected
// right under both settings.
var backends = []backend{
	{"sqlite", sqltest.SQLite, SQLite, false},
	{"postgres", sqltest.PostgreSQL, PostgreSQL, false},
	{"mysql", sqltest.MySQL, MySQL, false},
	{"mysql-found-rows", sqltest.MySQL, MySQL, true},
}

type backend struct {
	name      string
	kind      sqltest.Kind
	dialect   Dialect
	foundRows bool
}

// eachDB runs fn as one subtest per backend; one whose server does not
// accept its DSN is skipped with the server's answer.
func eachDB(t *testing.T, fn func(t *testing.T, d *testDB)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			d := sqltest.Open(t, b.kind)
			db := d.DB
			if b.foundRows {
				db = openFoundRows(t, d.DSN)
			}
			fn(t, &testDB{name: b.name, dialect: b.dialect, db: db})
		})
	}
}

// openFoundRows opens the MySQL database of dsn with CLIENT_FOUND_ROWS.
func openFoundRows(t *testing.T, dsn string) *sql.DB {
	cfg, err := mysql.ParseDSN(dsn)
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

func (d *testDB) rebind(query string) string { return d.dialect.Bind(query) }

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
