package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/sqldialect"
)

// indexName names the index on table's record_until, which the purge
// reads: table's name (a schema's dot made an underscore) and "_until",
// within the identifier limit of PostgreSQL (63 bytes) and MySQL (64);
// SQLite has none. A longer name keeps its beginning and ends with a hash
// of the whole, so that two long tables sharing a beginning get two
// indexes: MySQL refuses a longer name (the table could not be created),
// and PostgreSQL cuts it, which made the index of a 63-byte table's name
// the table's own name. (Whether PostgreSQL has the index is read from
// its catalog, whatever the index is called: a table indexed under the
// cut name is not indexed again.)
func indexName(d sqldialect.Dialect, table string) string {
	name := strings.ReplaceAll(table, ".", "_") + "_until"
	if len(name) <= sqldialect.MaxIdentifier || d == sqldialect.SQLite {
		return name
	}
	sum := sha256.Sum256([]byte(table))
	suffix := "_" + hex.EncodeToString(sum[:4]) + "_until"
	return name[:sqldialect.MaxIdentifier-len(suffix)] + suffix
}

// sqlStatements are the SQL store's statements for one dialect and table.
// The table, one row per key:
//
//	id            the key's record name (keys.go), as Redis names it
//	record        the record's text (internal/keyspace's layout), NULL for none
//	record_until  when the record expires: the database's clock, µs since 1970
//	holder        the lock value whose lease holds the key, '' for none
//	holder_until  when that lease lapses, µs
//	waiting_until (PostgreSQL) until when a duplicate waits for the key, µs:
//	              the holder notifies when it lets go (WithSQLListener)
//
// Every time comes from the database's clock (now), read in the statement
// that uses it, so that instances whose clocks disagree still agree on
// when a lease lapses.
type sqlStatements struct {
	create string
	insert string // the key's row, unless it exists (its lock, on MySQL)
	// fresh claims a key that has no row in one statement: the row with
	// the claim's record, its fence the database's clock, and the lease.
	// Arguments: id, the record's line before and after the fence, the
	// record's life, the holder, the lease. It returns the fence where the
	// dialect can (freshReturns), and inserts nothing over a row.
	fresh        string
	freshReturns bool
	read         string // the row, unlocked
	lock         string // the row, locked until the transaction ends
	update       string // the row, written back
	store        string // an answer over the claim as it was written, in one statement
	storeHeld    string // the same in the handler's transaction, the lease kept (StoreAnswerInTx)
	renew        string // our live lease, a lease from now
	unlock       string // our lease, let go
	purge        string // up to purgeBatch rows with neither a record nor a lease
	// notifies: store and unlock answer a row (rows changed, holders
	// notified) rather than a count of rows, for they notify the key's
	// waiters, as notify does in a transaction, and wait marks the row
	// for it (PostgreSQL).
	notifies bool
	notify   string
	wait     string
	waiting  string // the waiting_until column, added to a table of an earlier version
	index    string // the record_until index (MySQL's is in create)
	indexed  string // whether that index is there (PostgreSQL), asked before index makes it
}

// statementsFor builds the statements for table, quoted as d quotes it;
// holders notify channel (sqlChannel) on PostgreSQL.
func statementsFor(d sqldialect.Dialect, table, channel string) sqlStatements {
	now := keyspace.SQLNow(d) // the operator's statements read the same clock
	var insert, forUpdate, create, purge string
	unquoted := strings.ReplaceAll(table, `"`, "")
	index := indexName(d, unquoted)
	switch d {
	case sqldialect.PostgreSQL:
		insert = "INSERT INTO " + table + " (id) VALUES (?) ON CONFLICT (id) DO NOTHING"
		forUpdate = " FOR UPDATE"
		create = "CREATE TABLE IF NOT EXISTS " + table + " (id TEXT PRIMARY KEY, record BYTEA, " +
			"record_until BIGINT NOT NULL DEFAULT 0, holder TEXT NOT NULL DEFAULT '', holder_until BIGINT NOT NULL DEFAULT 0, " +
			"waiting_until BIGINT NOT NULL DEFAULT 0)"
	case sqldialect.MySQL:
		// ON DUPLICATE KEY UPDATE locks an existing row at once: INSERT
		// IGNORE would take a shared lock, and two of them upgrading to
		// FOR UPDATE deadlock.
		insert = "INSERT INTO " + table + " (id) VALUES (?) ON DUPLICATE KEY UPDATE id = id"
		forUpdate = " FOR UPDATE"
		create = "CREATE TABLE IF NOT EXISTS " + table + " (id VARBINARY(512) NOT NULL PRIMARY KEY, record LONGBLOB NULL, " +
			"record_until BIGINT NOT NULL DEFAULT 0, holder VARBINARY(64) NOT NULL DEFAULT '', " +
			"holder_until BIGINT NOT NULL DEFAULT 0, KEY " + d.Quote(strings.ReplaceAll(index, "`", "")) +
			" (record_until)) ENGINE=InnoDB"
	default: // SQLite
		insert = "INSERT OR IGNORE INTO " + table + " (id) VALUES (?)"
		create = "CREATE TABLE IF NOT EXISTS " + table + " (id TEXT PRIMARY KEY, record BLOB, " +
			"record_until INTEGER NOT NULL DEFAULT 0, holder TEXT NOT NULL DEFAULT '', holder_until INTEGER NOT NULL DEFAULT 0)"
	}
	q := sqlStatements{create: create}
	if d != sqldialect.MySQL {
		q.index = "CREATE INDEX IF NOT EXISTS " + d.Quote(strings.ReplaceAll(index, "`", "")) +
			" ON " + table + " (record_until)"
	}
	if d == sqldialect.PostgreSQL {
		// CREATE INDEX IF NOT EXISTS takes its table's share lock before
		// it finds the index there: it waits behind every open write
		// transaction on the table, and every write after it waits
		// behind it. Looked for first, as the waiting_until column is: an
		// index of the table's whose first column is record_until, under
		// any name.
		q.indexed = "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid " +
			"AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass('" + d.Quote(unquoted) + "') AND a.attname = 'record_until')"
	}
	// The purge reads the clock once for the statement (PostgreSQL's
	// clock_timestamp is read per row, and keeps the planner off the
	// record_until index).
	stable := strings.Replace(now, "clock_timestamp()", "statement_timestamp()", 1)
	expired := "record_until <= " + stable + " AND holder_until <= " + stable
	switch d {
	case sqldialect.MySQL:
		purge = "DELETE FROM " + table + " WHERE " + expired + " LIMIT " + strconv.Itoa(purgeBatch)
	default:
		// The condition again outside the subquery: PostgreSQL re-checks
		// only the outer WHERE on a row that a claim changed while the
		// purge waited for it, and without it deleted the live record the
		// claim had just written (a key then ran twice). SKIP LOCKED leaves
		// rows that claims hold to the next purge.
		skip := ""
		if d == sqldialect.PostgreSQL {
			skip = " FOR UPDATE SKIP LOCKED"
		}
		purge = "DELETE FROM " + table + " WHERE id IN (SELECT id FROM " + table + " WHERE " + expired +
			" LIMIT " + strconv.Itoa(purgeBatch) + skip + ") AND " + expired
	}
	waiting := "0"
	if d == sqldialect.PostgreSQL {
		waiting = "waiting_until"
	}
	read := "SELECT record, record_until, holder, holder_until, " + waiting + ", " + now + " FROM " + table + " WHERE id = ?"
	q.fresh, q.freshReturns = freshClaim(d, table, now)
	q.insert = d.Bind(insert)
	q.read = d.Bind(read)
	q.lock = d.Bind(read + forUpdate)
	q.update = d.Bind("UPDATE " + table + " SET record = ?, record_until = ?, holder = ?, holder_until = ? WHERE id = ?")
	// MySQL assigns left to right, each assignment seeing the ones before:
	// holder_until goes before the holder it tests.
	q.store = d.Bind(q.notifying(d, channel, now, "UPDATE "+table+" SET record = ?, record_until = "+now+" + ?, "+
		"holder_until = CASE WHEN holder = ? THEN 0 ELSE holder_until END, "+
		"holder = CASE WHEN holder = ? THEN '' ELSE holder END "+
		"WHERE id = ? AND record = ? AND record_until > "+now))
	q.storeHeld = d.Bind("UPDATE " + table + " SET record = ?, record_until = " + now + " + ? " +
		"WHERE id = ? AND record = ? AND record_until > " + now)
	if d == sqldialect.PostgreSQL {
		// Above READ COMMITTED, a row the lease's renewals changed after
		// the transaction's snapshot aborts the transaction: the statement
		// writes only at READ COMMITTED, and says whether it could.
		q.storeHeld = d.Bind("WITH c AS (SELECT current_setting('transaction_isolation') = 'read committed' AS here), " +
			"u AS (UPDATE " + table + " SET record = ?, record_until = " + now + " + ? " +
			"WHERE id = ? AND record = ? AND record_until > " + now + " AND (SELECT here FROM c) RETURNING 1) " +
			"SELECT (SELECT here FROM c), (SELECT count(*) FROM u)")
	}
	q.renew = d.Bind("UPDATE " + table + " SET holder_until = " + now + " + ? WHERE id = ? AND holder = ? AND holder_until > " + now)
	q.unlock = d.Bind(q.notifying(d, channel, now, "UPDATE "+table+" SET holder = '', holder_until = 0 WHERE id = ? AND holder = ?"))
	q.purge = d.Bind(purge)
	if q.notifies {
		q.notify = d.Bind("SELECT pg_notify('" + channel + "', ?)")
		q.wait = d.Bind("UPDATE " + table + " SET waiting_until = GREATEST(waiting_until, " + now + " + ?) WHERE id = ?")
		q.waiting = "ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS waiting_until BIGINT NOT NULL DEFAULT 0"
	}
	return q
}

// notifying is update (one key's row, without RETURNING) as it notifies
// the key's waiters on PostgreSQL, in the same statement: a row that
// someone waits for gets its id sent on channel, delivered when the
// statement commits. Keys nobody waits for send nothing (NOTIFY holds a
// lock of the whole database while it commits). Elsewhere update is
// returned as it is.
func (q *sqlStatements) notifying(d sqldialect.Dialect, channel, now, update string) string {
	if d != sqldialect.PostgreSQL {
		return update
	}
	q.notifies = true
	// The notification's column is counted, so that no planner drops the
	// join that sends it.
	return "WITH u AS (" + update + " RETURNING id, waiting_until) SELECT count(*), count(n.sent) FROM u " +
		"LEFT JOIN LATERAL (SELECT CAST(pg_notify('" + channel + "', u.id) AS TEXT) AS sent " +
		"WHERE u.waiting_until > " + now + ") n ON true"
}

// freshClaim is sqlStatements.fresh for d.
func freshClaim(d sqldialect.Dialect, table, now string) (stmt string, returns bool) {
	columns := "INSERT INTO " + table + " (id, record, record_until, holder, holder_until) "
	switch d {
	case sqldialect.PostgreSQL:
		return d.Bind(columns + "SELECT ?, convert_to(CAST(? AS TEXT) || CAST(n AS TEXT) || CAST(? AS TEXT), 'UTF8'), " +
			"n + CAST(? AS BIGINT), ?, n + CAST(? AS BIGINT) FROM (SELECT " + now + " AS n) c WHERE n < CAST(? AS BIGINT) " +
			"ON CONFLICT (id) DO NOTHING RETURNING record_until - CAST(? AS BIGINT)"), true
	case sqldialect.MySQL:
		// No RETURNING: the claim's read that follows finds it.
		return columns + "SELECT ?, CONCAT(?, n, ?), n + ?, ?, n + ? FROM (SELECT " + now + " AS n) c WHERE n < ? " +
			"ON DUPLICATE KEY UPDATE id = id", false
	}
	// SQLite: a WHERE keeps ON CONFLICT from being read as a join's.
	return columns + "SELECT ?, CAST(? || n || ? AS BLOB), n + ?, ?, n + ? FROM (SELECT " + now + " AS n) " +
		"WHERE n < ? ON CONFLICT (id) DO NOTHING RETURNING record_until - ?", true
}
