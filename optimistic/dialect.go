package optimistic

import (
	"fmt"

	"github.com/onceonly/idempotency/sqldialect"
)

// Dialect is the SQL flavour a Table speaks: how it writes placeholders and
// quotes identifiers. There is no default: a Table without a Dialect is
// refused, because guessing wrong turns every statement into a syntax error
// (or, for quoting, into a reference to another column). It is the same
// type as sqlidem.Dialect.
type Dialect = sqldialect.Dialect

const (
	// SQLite writes ? placeholders and "double-quoted" identifiers.
	SQLite = sqldialect.SQLite
	// PostgreSQL writes $1, $2, … placeholders and "double-quoted"
	// identifiers. Quoted names are case-sensitive there: give them as the
	// catalog stores them (lower case for names created unquoted).
	PostgreSQL = sqldialect.PostgreSQL
	// MySQL (and MariaDB) writes ? placeholders and `back-quoted`
	// identifiers, which work whether or not sql_mode has ANSI_QUOTES.
	MySQL = sqldialect.MySQL
)

// maxIdentifier is the longest name accepted (PostgreSQL's limit).
const maxIdentifier = sqldialect.MaxIdentifier

// validName checks that s is a plain SQL identifier: an ASCII letter or
// underscore, then letters, digits or underscores, at most 63 bytes. With
// qualified set, one dot may join a schema and a table name.
func validName(s string, qualified bool) error {
	if !sqldialect.ValidName(s, qualified) {
		return fmt.Errorf("optimistic: invalid SQL name %q: use letters, digits and underscores, at most %d, "+
			"not starting with a digit (and at most one dot for a schema)", s, maxIdentifier)
	}
	return nil
}
