package sqlidem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/onceonly/idempotency/sqldialect"
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

// ddl is the outcome table's DDL in d: the table (quoted) and an index on
// the write time, named index, for Purge. The record key is compared byte
// for byte (MySQL's default collations would fold case, and two keys that
// differ in case are two requests).
func ddl(d Dialect, table, index string) []string {
	if d == MySQL {
		// MySQL has no CREATE INDEX IF NOT EXISTS (MariaDB has): the index
		// is part of the table (CreateTable adds it to an older table).
		return []string{strings.Replace(createTable(d, table), "\n)", ",\n\tINDEX "+d.Quote(index)+" (written_ms)\n)", 1)}
	}
	return []string{createTable(d, table), createIndex(d, table, index)}
}

// createIndex is the index on the write time that Purge reads.
func createIndex(d Dialect, table, index string) string {
	ifNotExists := " IF NOT EXISTS"
	if d == MySQL {
		ifNotExists = ""
	}
	return "CREATE INDEX" + ifNotExists + " " + d.Quote(index) + " ON " + table + " (written_ms)"
}

// indexName names the write-time index of table: an identifier of at most
// 63 bytes (longer names are cut short by PostgreSQL), unique per table.
func indexName(table string) string {
	base := table[strings.LastIndexByte(table, '.')+1:]
	if name := base + "_written"; len(name) <= sqldialect.MaxIdentifier {
		return name
	}
	sum := sha256.Sum256([]byte(base))
	return base[:40] + "_" + hex.EncodeToString(sum[:6]) + "_written"
}

// purgeBatch is how many rows one statement of Purge deletes.
const purgeBatch = 1000

// purgeStatement deletes up to purgeBatch of the oldest rows written
// before its argument, found through the write-time index, and deleted by
// their primary keys. Arguments: cutoff, twice (the outer test sees a row
// as the DELETE does, should it have been rewritten since the inner read).
//
// MySQL would not use the index for DELETE … ORDER BY written_ms LIMIT n
// when most rows match: MariaDB scanned the whole table, with next-key
// locks on every row and gap, which held up every new key's INSERT. Nor
// does it take LIMIT in an IN subquery; a derived table it takes, and
// reads through the index (FORCE INDEX: MariaDB's DELETE takes no hint).
func purgeStatement(d Dialect, table, index string) string {
	if d == MySQL {
		return fmt.Sprintf("DELETE o FROM %[1]s AS o JOIN (SELECT record_key FROM %[1]s FORCE INDEX (%[2]s) "+
			"WHERE written_ms < ? ORDER BY written_ms LIMIT %[3]d) AS old USING (record_key) WHERE o.written_ms < ?",
			table, d.Quote(index), purgeBatch)
	}
	return d.Bind(fmt.Sprintf("DELETE FROM %[1]s WHERE record_key IN (SELECT record_key FROM %[1]s "+
		"WHERE written_ms < ? ORDER BY written_ms LIMIT %[2]d) AND written_ms < ?", table, purgeBatch))
}

// createTable is the outcome table (quoted) in d.
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
