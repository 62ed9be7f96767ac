// Package input checks the text fields of the shop's requests before any
// of them reaches a store: what one store keeps, every store must keep.
package input

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text reports whether s is 1 to maxBytes bytes of printable text: valid
// UTF-8 without control characters. PostgreSQL refuses a NUL in text and
// invalid UTF-8 in every column, and MySQL cuts or refuses what is longer
// than its column, while Redis and SQLite keep any bytes: a request that
// only some stores can keep is refused on all of them, before it runs.
func Text(s string, maxBytes int) bool {
	return s != "" && len(s) <= maxBytes && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}
