package sqlidem

import (
	"fmt"
	"strconv"
	"strings"
)

// Dialect is the SQL flavour of the database that holds the outcomes. There
// is no default: a wrong guess turns every statement into a syntax error.
type Dialect uint8

const (
	// SQLite: ? placeholders, ON CONFLICT upserts.
	SQLite Dialect = iota + 1
	// PostgreSQL: $1, $2, … placeholders, ON CONFLICT upserts.
	PostgreSQL
	// MySQL and MariaDB: ? placeholders, ON DUPLICATE KEY upserts.
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

// bind rewrites a statement written with ? placeholders for d.
func (d Dialect) bind(query string) string {
	if d != PostgreSQL {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// createTable is the DDL of the outcome table in d. The record key is
// compared byte for byte (MySQL's default collations would fold case, and
// two keys that differ in case are two requests).
func (d Dialect) createTable(table string) string {
	key, text, blob := "TEXT", "TEXT", "BLOB"
	switch d {
	case PostgreSQL:
		blob = "BYTEA"
	case MySQL:
		key, text, blob = "VARBINARY(512)", "MEDIUMTEXT", "LONGBLOB"
	}
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	record_key  %s PRIMARY KEY,
	fingerprint VARCHAR(64) NOT NULL,
	fence       BIGINT NOT NULL,
	state       VARCHAR(8) NOT NULL,
	status      INTEGER NOT NULL,
	header      %s NOT NULL,
	body        %s,
	written_ms  BIGINT NOT NULL
)`, table, key, text, blob)
}

// fenceUpsert writes a fence row for a key with nothing committed, or
// raises the fence of one; a committed answer is never touched.
// Arguments: key, fence, written_ms.
func (d Dialect) fenceUpsert(table string) string {
	insert := "INSERT INTO " + table + ` AS o (record_key, fingerprint, fence, state, status, header, body, written_ms)
	VALUES (?, '', ?, 'fenced', 0, '', NULL, ?)`
	if d == MySQL {
		insert = "INSERT INTO " + table + ` (record_key, fingerprint, fence, state, status, header, body, written_ms)
	VALUES (?, '', ?, 'fenced', 0, '', NULL, ?)`
		// written_ms first: once fence is assigned, the condition reads
		// the new value.
		return d.bind(insert + `
	ON DUPLICATE KEY UPDATE
	written_ms = IF(state = 'fenced' AND fence < VALUES(fence), VALUES(written_ms), written_ms),
	fence = IF(state = 'fenced' AND fence < VALUES(fence), VALUES(fence), fence)`)
	}
	return d.bind(insert + `
	ON CONFLICT (record_key) DO UPDATE SET fence = excluded.fence, written_ms = excluded.written_ms
	WHERE o.state = 'fenced' AND o.fence < excluded.fence`)
}

// validTable reports whether s is a plain SQL name, optionally qualified
// by a schema: letters, digits and underscores, not starting with a digit.
// Validation keeps injection out of the statements the name goes into.
func validTable(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 || (p[0] >= '0' && p[0] <= '9') {
			return false
		}
		for _, c := range p {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}
