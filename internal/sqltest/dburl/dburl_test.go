package dburl

import (
	"errors"
	"strings"
	"testing"

	"github.com/onceonly/idempotency/sqldialect"
)

func TestParse(t *testing.T) {
	pg := func(dsn string) Database { return Database{Pgx, dsn, sqldialect.PostgreSQL} }
	my := func(dsn string) Database { return Database{MySQL, dsn, sqldialect.MySQL} }
	lite := func(dsn string) Database { return Database{SQLite, dsn, sqldialect.SQLite} }
	for _, tc := range []struct {
		name, url string
		want      Database
	}{
		{"postgres", "postgres://u:p%40ss@db:5432/app?sslmode=disable", pg("postgres://u:p%40ss@db:5432/app?sslmode=disable")},
		{"postgresql", "postgresql://u@db/app", pg("postgresql://u@db/app")},
		{"scheme case", "PostgreSQL://u@db/app", pg("PostgreSQL://u@db/app")},

		{"mysql driver form", "mysql://root:pw@tcp(db:3306)/app", my("root:pw@tcp(db:3306)/app")},
		{"mysql driver form, params", "mysql://root:pw@tcp(db:3306)/app?parseTime=true&loc=Local", my("root:pw@tcp(db:3306)/app?parseTime=true&loc=Local")},
		{"mysql driver form, no user", "mysql://tcp(db:3306)/app", my("tcp(db:3306)/app")},
		{"mysql driver form, socket", "mysql://root@unix(/run/mysqld/mysqld.sock)/app", my("root@unix(/run/mysqld/mysqld.sock)/app")},
		{"mysql driver form, no port", "mysql://root@tcp(db)/app", my("root@tcp(db)/app")},
		{"mysql driver form, password kept as written", "mysql://root:p@s:s/w(rd)@tcp(db:3306)/app", my("root:p@s:s/w(rd)@tcp(db:3306)/app")},
		{"mysql driver form, scheme case", "MySQL://root@tcp(db:3306)/app", my("root@tcp(db:3306)/app")},

		{"mysql URL form", "mysql://root:pw@db:3307/app", my("root:pw@tcp(db:3307)/app")},
		{"mysql URL form, params", "mysql://root:pw@db:3307/app?parseTime=true&loc=Europe%2FParis", my("root:pw@tcp(db:3307)/app?parseTime=true&loc=Europe%2FParis")},
		{"mysql URL form, no port", "mysql://root@db/app", my("root@tcp(db:3306)/app")},
		{"mysql URL form, IPv6", "mysql://root@[::1]/app", my("root@tcp([::1]:3306)/app")},
		{"mysql URL form, IPv6 and port", "mysql://root@[::1]:3307/app", my("root@tcp([::1]:3307)/app")},
		{"mysql URL form, encoded password", "mysql://root:p%40ss%2Fw%3Fo%3Ar%23d@db/app", my("root:p@ss/w?o:r#d@tcp(db:3306)/app")},
		{"mysql URL form, raw sub-delims in password", "mysql://root:a!$&'(*)+,;=b@db/app", my("root:a!$&'(*)+,;=b@tcp(db:3306)/app")},
		{"mysql URL form, raw @ in password", "mysql://root:p@ss@db/app", my("root:p@ss@tcp(db:3306)/app")},
		{"mysql URL form, encoded user", "mysql://app%40eu:pw@db/app", my("app@eu:pw@tcp(db:3306)/app")},
		{"mysql URL form, empty password", "mysql://root:@db/app", my("root:@tcp(db:3306)/app")},
		{"mysql URL form, no user", "mysql://db:3306/app", my("tcp(db:3306)/app")},
		{"mysql URL form, no host", "mysql://root@/app", my("root@/app")},
		{"mysql URL form, no database", "mysql://root@db", my("root@tcp(db:3306)/")},
		{"mysql URL form, parenthesis in params", "mysql://root@db/app?init=f(1)", my("root@tcp(db:3306)/app?init=f(1)")},

		{"sqlite path", "sqlite:/var/lib/app.db", lite("/var/lib/app.db")},
		{"sqlite URL", "sqlite:///var/lib/app.db", lite("/var/lib/app.db")},
		{"sqlite relative", "sqlite:app.db", lite("app.db")},
		{"file", "file:/var/lib/app.db?_pragma=busy_timeout(5000)", lite("file:/var/lib/app.db?_pragma=busy_timeout(5000)")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.url)
			if err != nil || got != tc.want {
				t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		unknown   bool
	}{
		{"bare DSN", "host=db user=u dbname=app", true},
		{"bare MySQL DSN", "root:secret@tcp(db:3306)/app", true},
		{"other scheme", "sqlserver://u:secret@db/app", true},
		{"empty", "", true},
		{"postgres without //", "postgres:secret@tcp(db)/app", true},
		{"bad port", "mysql://root:secret@db:port/app", false},
		{"raw # in password", "mysql://root:sec#ret@db/app", false},
		{"raw / in password", "mysql://root:sec/ret@db/app", false},
		{"raw ? in password", "mysql://root:sec?ret@db/app", false},
		{"slash in database", "mysql://root:secret@db/app/more", false},
		{"colon in user", "mysql://ro%3Aot:secret@db/app", false},
		{"bad escape", "mysql://root:secret%zz@db/app", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.url)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", tc.url)
			}
			if errors.Is(err, ErrUnknownScheme) != tc.unknown {
				t.Errorf("Parse(%q): %v; want ErrUnknownScheme %v", tc.url, err, tc.unknown)
			}
			// Not even the password's start: url.Parse quotes what it
			// takes for a port (":sec").
			if strings.Contains(err.Error(), "sec") {
				t.Errorf("Parse(%q): %v quotes the password", tc.url, err)
			}
		})
	}
}

// FuzzParse checks that no URL panics, that an error never quotes the
// password, and that a MySQL DSN always has the slash before its database
// name that go-sql-driver looks for.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"mysql://root:pw@tcp(db:3306)/app", "mysql://root:p%40ss@db/app?x=y",
		"postgres://u@db/app", "sqlite:/x.db", "file:x.db", "mysql://u:(x@db/a",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		d, err := Parse(raw)
		if err != nil {
			if u, _, ok := strings.Cut(raw, "@"); ok {
				if _, pw, ok := strings.Cut(u, "//"); ok && len(pw) > 8 && strings.Contains(err.Error(), pw) {
					t.Fatalf("Parse(%q): %v quotes the user info", raw, err)
				}
			}
			return
		}
		if d.Driver == MySQL && !strings.Contains(d.DSN, "/") {
			t.Fatalf("Parse(%q) = %q: no slash", raw, d.DSN)
		}
	})
}
