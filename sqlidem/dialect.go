package sqlidem

import (
	"fmt"

	"github.com/onceonly/idempotency/internal/sqldialect"
)

// Dialect is the SQL flavour of the database that holds the outcomes. There
// is no default: a wrong guess turns every statement into a syntax error.
// It is the same type as optimistic.Dialect.
type Dialect = sqldialect.Dialect

const (
	// SQLite: ? placeholders, ON CONFLICT upserts.
	SQLite = sqldialect.SQLite
	// PostgreSQL: $1, $2, … placeholders, ON CONFLICT upserts.
	PostgreSQL = sqldialect.PostgreSQL
	// MySQL and MariaDB: ? placeholders, ON DUPLICATE KEY upserts.
	MySQL = sqldialect.MySQL
)

// createTable is the DDL of the outcome table (quoted) in d. The record key
// is compared byte for byte (MySQL's default collations would fold case,
// and two keys that differ in case are two requests).
func createTable(d Dialect, table string) string {
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
func fenceUpsert(d Dialect, table string) string {
	const columns = ` (record_key, fingerprint, fence, state, status, header, body, written_ms)
	VALUES (?, '', ?, 'fenced', 0, '', NULL, ?)`
	if d == MySQL {
		// written_ms first: once fence is assigned, the condition reads
		// the new value.
		return "INSERT INTO " + table + columns + `
	ON DUPLICATE KEY UPDATE
	written_ms = IF(state = 'fenced' AND fence < VALUES(fence), VALUES(written_ms), written_ms),
	fence = IF(state = 'fenced' AND fence < VALUES(fence), VALUES(fence), fence)`
	}
	return d.Bind("INSERT INTO " + table + " AS o" + columns + `
	ON CONFLICT (record_key) DO UPDATE SET fence = excluded.fence, written_ms = excluded.written_ms
	WHERE o.state = 'fenced' AND o.fence < excluded.fence`)
}
