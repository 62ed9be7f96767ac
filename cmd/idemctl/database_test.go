package main

import (
	"errors"
	"testing"

	"github.com/onceonly/idempotency/sqlidem"
)

func TestDatabaseOf(t *testing.T) {
	for _, tc := range []struct {
		dsn, driver string
		want        database
	}{
		{"postgres://u@db:5432/app", "", database{"pgx", "postgres://u@db:5432/app", sqlidem.PostgreSQL}},
		{"postgresql://u@db/app?sslmode=disable", "", database{"pgx", "postgresql://u@db/app?sslmode=disable", sqlidem.PostgreSQL}},
		{"host=db user=u dbname=app", "postgres", database{"pgx", "host=db user=u dbname=app", sqlidem.PostgreSQL}},
		{"mysql://root:pw@db:3307/app?parseTime=true", "", database{"mysql", "root:pw@tcp(db:3307)/app?parseTime=true", sqlidem.MySQL}},
		{"mysql://root@db/app", "", database{"mysql", "root@tcp(db:3306)/app", sqlidem.MySQL}},
		{"root@tcp(db:3306)/app", "mysql", database{"mysql", "root@tcp(db:3306)/app", sqlidem.MySQL}},
		{"sqlite:/var/lib/app.db", "", database{"sqlite", "/var/lib/app.db", sqlidem.SQLite}},
		{"sqlite:///var/lib/app.db", "", database{"sqlite", "/var/lib/app.db", sqlidem.SQLite}},
		{"file:/var/lib/app.db?_pragma=busy_timeout(5000)", "", database{"sqlite", "file:/var/lib/app.db?_pragma=busy_timeout(5000)", sqlidem.SQLite}},
		{"app.db", "sqlite", database{"sqlite", "app.db", sqlidem.SQLite}},
	} {
		got, err := databaseOf(tc.dsn, tc.driver)
		if err != nil || got != tc.want {
			t.Errorf("databaseOf(%q, %q) = %+v, %v; want %+v", tc.dsn, tc.driver, got, err, tc.want)
		}
	}
	for _, tc := range [][2]string{{"app.db", ""}, {"app.db", "oracle"}, {"mysql://root@db/app?timeout=soon", ""}} {
		var usage usageError
		if _, err := databaseOf(tc[0], tc[1]); !errors.As(err, &usage) {
			t.Errorf("databaseOf(%q, %q): %v, want a usage error", tc[0], tc[1], err)
		}
	}
}
