package bank

import (
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqlidem"
)

func TestOpenReadsBothMySQLForms(t *testing.T) {
	for _, url := range []string{
		"mysql://shop:s%40cr%2Fet@db:3307/bank?parseTime=true",
		"mysql://shop:s@cr/et@tcp(db:3307)/bank?parseTime=true",
	} {
		db, dialect, err := Open(url, "")
		if err != nil {
			t.Fatalf("Open(%q): %v", url, err)
		}
		db.Close()
		if _, ok := db.Driver().(*mysql.MySQLDriver); !ok || dialect != sqlidem.MySQL {
			t.Errorf("Open(%q): driver %T, dialect %v", url, db.Driver(), dialect)
		}
		d, err := source(url, "")
		if err != nil {
			t.Fatal(err)
		}
		c, err := mysql.ParseDSN(d.DSN)
		if err != nil || c.User != "shop" || c.Passwd != "s@cr/et" || c.Addr != "db:3307" || c.DBName != "bank" || !c.ParseTime {
			t.Errorf("%q reads as %+v, %v", url, c, err)
		}
	}
}

func TestOpenSources(t *testing.T) {
	for _, tc := range []struct {
		url, path string
		want      dburl.Database
	}{
		{"postgres://shop@db/bank?sslmode=disable", "ignored.db", dburl.Database{Driver: "pgx", DSN: "postgres://shop@db/bank?sslmode=disable", Dialect: sqlidem.PostgreSQL}},
		{"", "/var/lib/bank.db", dburl.Database{Driver: "sqlite", DSN: dburl.SQLiteDSN("/var/lib/bank.db"), Dialect: sqlidem.SQLite}},
	} {
		if got, err := source(tc.url, tc.path); err != nil || got != tc.want {
			t.Errorf("source(%q, %q) = %+v, %v; want %+v", tc.url, tc.path, got, err, tc.want)
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	for _, tc := range []struct{ url, path, want string }{
		{"", "", "no database"},
		{"sqlserver://shop:secret@db/bank", "", "must start with postgres:// or mysql://"},
		{"sqlite:/var/lib/bank.db", "", "must start with postgres:// or mysql://"},
		{"mysql://shop:secret@db:port/bank", "", "DATABASE_URL: "},
		{"mysql://shop:secret@tcp(db:3306)/bank?timeout=soon", "", "mysql://user:password@host:port/dbname"},
		{"mysql://shop:secret@db/bank?timeout=soon", "", "mysql://user:password@host:port/dbname"},
	} {
		_, _, err := Open(tc.url, tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q, %q): %v; want an error with %q", tc.url, tc.path, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): %v quotes the password", tc.url, err)
		}
	}
}

func TestParseURLReadsSQLiteFiles(t *testing.T) {
	d, err := ParseURL("IDEMPOTENCY_STORE", "sqlite:/var/lib/shop/keys.db")
	if err != nil || d.Dialect != sqlidem.SQLite || d.DSN != dburl.SQLiteDSN("/var/lib/shop/keys.db") {
		t.Errorf("sqlite: reads as %+v, %v", d, err)
	}
	for _, url := range []string{"sqlite:", "file:/var/lib/shop/keys.db", "redis://db:6379/0"} {
		if _, err := ParseURL("IDEMPOTENCY_STORE", url); err == nil || !strings.HasPrefix(err.Error(), "IDEMPOTENCY_STORE") {
			t.Errorf("ParseURL(%q): %v, want an error naming IDEMPOTENCY_STORE", url, err)
		}
	}
	if _, err := source("sqlite:/var/lib/shop/keys.db", ""); err == nil {
		t.Error("DATABASE_URL takes a SQLite file: that is DB_PATH's")
	}
}
