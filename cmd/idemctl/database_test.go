package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqlidem"
)

func TestDatabaseOf(t *testing.T) {
	pg := func(dsn string) dburl.Database {
		return dburl.Database{Driver: "pgx", DSN: dsn, Dialect: sqlidem.PostgreSQL}
	}
	my := func(dsn string) dburl.Database {
		return dburl.Database{Driver: "mysql", DSN: dsn, Dialect: sqlidem.MySQL}
	}
	lite := func(dsn string) dburl.Database {
		return dburl.Database{Driver: "sqlite", DSN: dsn, Dialect: sqlidem.SQLite}
	}
	for _, tc := range []struct {
		dsn, driver string
		want        dburl.Database
	}{
		{"postgres://u@db:5432/app", "", pg("postgres://u@db:5432/app")},
		{"postgresql://u@db/app?sslmode=disable", "", pg("postgresql://u@db/app?sslmode=disable")},
		{"host=db user=u dbname=app", "postgres", pg("host=db user=u dbname=app")},
		{"mysql://root:pw@db:3307/app?parseTime=true", "", my("root:pw@tcp(db:3307)/app?parseTime=true")},
		{"mysql://root@db/app", "", my("root@tcp(db:3306)/app")},
		// The example service's DATABASE_URL, which idemctl's -db defaults to.
		{"mysql://root:pw@tcp(db:3307)/app?parseTime=true", "", my("root:pw@tcp(db:3307)/app?parseTime=true")},
		{"mysql://root:pw@tcp(db:3307)/app", "mysql", my("root:pw@tcp(db:3307)/app")},
		{"root@tcp(db:3306)/app", "mysql", my("root@tcp(db:3306)/app")},
		{"sqlite:pw@tcp(db:3306)/app", "mariadb", my("sqlite:pw@tcp(db:3306)/app")}, // a user named sqlite
		{"sqlite:/var/lib/app.db", "", lite("/var/lib/app.db")},
		{"sqlite:///var/lib/app.db", "", lite("/var/lib/app.db")},
		{"file:/var/lib/app.db?_pragma=busy_timeout(5000)", "", lite("file:/var/lib/app.db?_pragma=busy_timeout(5000)")},
		{"app.db", "sqlite", lite("app.db")},
	} {
		got, err := databaseOf(tc.dsn, tc.driver)
		if err != nil || got != tc.want {
			t.Errorf("databaseOf(%q, %q) = %+v, %v; want %+v", tc.dsn, tc.driver, got, err, tc.want)
		}
	}
	for _, tc := range [][2]string{
		{"app.db", ""}, {"app.db", "oracle"}, {"mysql://root@db/app?timeout=soon", ""},
		{"mysql://root@tcp(db:3306)/app?timeout=soon", ""}, {"mysql://root:secret@db:port/app", ""},
		{"mysql://root:sec#ret@db/app", ""}, {"mysql://root:sec/ret@db/app", "mysql"},
	} {
		var usage usageError
		_, err := databaseOf(tc[0], tc[1])
		if !errors.As(err, &usage) {
			t.Errorf("databaseOf(%q, %q): %v, want a usage error", tc[0], tc[1], err)
		} else if strings.Contains(err.Error(), "sec") { // nor the password's start
			t.Errorf("databaseOf(%q, %q): %v quotes the password", tc[0], tc[1], err)
		}
	}
}

// Both MySQL forms reach go-sql-driver with the same password, whatever
// characters it holds.
func TestMySQLPasswords(t *testing.T) {
	for _, url := range []string{
		"mysql://ops:p%40ss%2Fw%3Fo%3Ar%23d@db/app?parseTime=true",
		"mysql://ops:p@ss/w?o:r#d@tcp(db:3306)/app?parseTime=true",
	} {
		d, err := databaseOf(url, "")
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		c, err := mysql.ParseDSN(d.DSN)
		if err != nil || c.User != "ops" || c.Passwd != "p@ss/w?o:r#d" || c.Addr != "db:3306" || c.DBName != "app" || !c.ParseTime {
			t.Errorf("%s reads as %+v, %v", url, c, err)
		}
	}
}
