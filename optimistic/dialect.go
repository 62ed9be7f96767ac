package optimistic

import (
	"fmt"
	"strconv"
	"strings"
)

// Dialect is the SQL flavour a Table speaks: how it writes placeholders and
// quotes identifiers. There is no default: a Table without a Dialect is
// refused, because guessing wrong turns every statement into a syntax error
// (or, for quoting, into a reference to another column).
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

func (d Dialect) valid() bool { return d >= SQLite && d <= MySQL }

// placeholder is the n-th (from 1) parameter marker of a statement.
func (d Dialect) placeholder(n int) string {
	if d == PostgreSQL {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// quote quotes a name that validName accepted. Validation, not escaping, is
// what keeps injection out: an accepted name holds no quote character at
// all. Quoting on top lets reserved words ("order", "key") serve as names.
func (d Dialect) quote(name string) string {
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

// maxIdentifier is PostgreSQL's limit (it silently truncates longer names;
// MySQL allows 64), so a name accepted here means the same everywhere.
const maxIdentifier = 63

// validName reports whether s is a plain SQL identifier: an ASCII letter or
// underscore, then letters, digits or underscores, at most 63 bytes. With
// qualified set, one dot may join a schema and a table name.
func validName(s string, qualified bool) error {
	parts := []string{s}
	if qualified {
		parts = strings.Split(s, ".")
		if len(parts) > 2 {
			return fmt.Errorf("optimistic: invalid SQL name %q: more than one dot", s)
		}
	}
	for _, p := range parts {
		if !validIdentifier(p) {
			return fmt.Errorf("optimistic: invalid SQL name %q: use letters, digits and underscores, at most %d, not starting with a digit", s, maxIdentifier)
		}
	}
	return nil
}

func validIdentifier(s string) bool {
	if s == "" || len(s) > maxIdentifier {
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
