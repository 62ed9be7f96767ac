// Package sqldialect is what the SQL packages of this repository
// (optimistic, sqlidem) know about the databases they speak to:
// placeholders, quoting, which names are safe to put into a statement, and
// which errors a database answers when a transaction may simply run again.
// Both export its Dialect as their own, so one value serves both; a
// program seldom imports it, except for Retryable.
//
// It is a module of its own, with no dependency, so that optimistic and
// sqlidem share it without either requiring the other or reaching into
// the root module's internals.
package sqldialect

import (
	"strconv"
	"strings"
)

// Dialect is the SQL flavour of a database. There is no default: guessing
// wrong turns every statement into a syntax error (or, for quoting, into a
// reference to another column).
type Dialect uint8

const (
	// SQLite writes ? placeholders and "double-quoted" identifiers.
	SQLite Dialect = iota + 1
	// PostgreSQL writes $1, $2, … placeholders and "double-quoted"
	// identifiers. Quoted names are case-sensitive there: give them as the
	// catalog stores them (lower case for names created unquoted).
	PostgreSQL
	// MySQL (and MariaDB) writes ? placeholders and `back-quoted`
	// identifiers, which work whether or not sql_mode has ANSI_QUOTES.
	MySQL
)

func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "SQLite"
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Valid reports whether d is one of the dialects above.
func (d Dialect) Valid() bool { return d >= SQLite && d <= MySQL }

// Placeholder is the n-th (from 1) parameter marker of a statement.
func (d Dialect) Placeholder(n int) string {
	if d == PostgreSQL {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// Bind rewrites a statement written with ? placeholders for d. The
// statement must hold no other question mark (no string literal with one).
func (d Dialect) Bind(query string) string {
	if d != PostgreSQL {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteString(d.Placeholder(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// Quote quotes a name that ValidName accepted. Validation, not escaping, is
// what keeps injection out: an accepted name holds no quote character at
// all. Quoting on top lets reserved words ("order", "key") serve as names.
func (d Dialect) Quote(name string) string {
	q := `"`
	if d == MySQL {
		q = "`"
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = q + p + q
	}
	return strings.Join(parts, ".")
}

// MaxIdentifier is PostgreSQL's limit (it silently truncates longer names;
// MySQL allows 64), so a name accepted here means the same everywhere.
const MaxIdentifier = 63

// ValidName reports whether s is a plain SQL identifier (see
// ValidIdentifier) or, with qualified set, two joined by one dot: a schema
// and a table name.
func ValidName(s string, qualified bool) bool {
	parts := []string{s}
	if qualified {
		parts = strings.Split(s, ".")
		if len(parts) > 2 {
			return false
		}
	}
	for _, p := range parts {
		if !ValidIdentifier(p) {
			return false
		}
	}
	return true
}

// ValidIdentifier reports whether s is an ASCII letter or underscore, then
// letters, digits or underscores, at most MaxIdentifier bytes.
func ValidIdentifier(s string) bool {
	if s == "" || len(s) > MaxIdentifier {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
