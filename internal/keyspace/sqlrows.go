package keyspace

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onceonly/idempotency/sqldialect"
)

// SQLRows is the table a middleware made by NewSQL keeps its keys in: one
// row per key (sqlstatements.go in the root), whose id is the record's
// name as Redis names it, so that Parse reads an operator's names here
// too. Its methods are the Go twins of inspect.lua and settle.lua, each
// read of a row one statement and each settle one transaction on the row
// read under a lock, against the database's clock.
type SQLRows struct {
	DB      *sql.DB
	Dialect sqldialect.Dialect
	Table   string // as WithSQLTable names it, unquoted
	// Serial, when set, is held around each transaction: for SQLite, the
	// middleware's own lock of the process, which its operations hold
	// since SQLite has no FOR UPDATE.
	Serial sync.Locker
}

// SQLNow is the database's clock, in microseconds since 1970, as a
// dialect writes it: every time the SQL store keeps (a record's expiry, a
// lease's end, a fence) is read from it, so that instances whose clocks
// disagree agree on when a lease lapses. The store's statements
// (sqlstatements.go in the root) and the operator's must read the same
// clock.
func SQLNow(d sqldialect.Dialect) string {
	switch d {
	case sqldialect.PostgreSQL:
		return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
	case sqldialect.MySQL:
		// Arithmetic on UTC, with no time zone's conversion: through
		// local time, the hour a daylight-saving change repeats would turn
		// the clock back.
		return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
	}
	// SQLite: its clock has milliseconds.
	return "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)"
}

// peek is how much of a record a walk of the table reads: enough for the
// line of any record a claim writes, whose fields hold no answer.
const peek = 1024

// sqlPage is how many rows one step of Interrupted reads, as scanPage
// bounds a SCAN step.
const sqlPage = 1000

// errSQLRetries: a settle met a deadlock or a serialization failure too
// many times in a row.
var errSQLRetries = errors.New("admin: the database kept refusing the settle as a conflict; nothing changed")

// statement is query, with the table and the clock put in and its
// placeholders written for the dialect. query names them TABLE and NOW.
func (q *SQLRows) statement(query string) string {
	r := strings.NewReplacer("TABLE", q.Dialect.Quote(q.Table), "NOW", SQLNow(q.Dialect))
	return q.Dialect.Bind(r.Replace(query))
}

// sqlRow is a key's row as it stands: the record and the lease, what has
// expired dropped, and the database's clock when it was read.
type sqlRow struct {
	record      string // "" for none
	recordUntil int64
	holder      string // "" for none
	holderUntil int64
	now         int64
}

const rowColumns = "record_until, holder, holder_until, NOW"

// scan reads dest, then the row's columns after its record (rowColumns).
func (r *sqlRow) scan(scan func(...any) error, dest ...any) error {
	return scan(append(dest, &r.recordUntil, &r.holder, &r.holderUntil, &r.now)...)
}

// read sets the row's record, and drops what has expired, as the store
// does (sqlStore.scanRow).
func (r *sqlRow) read(record []byte) {
	r.record = string(record)
	if r.recordUntil <= r.now {
		r.record, r.recordUntil = "", 0
	}
	if r.holderUntil <= r.now {
		r.holder, r.holderUntil = "", 0
	}
}

// state is what inspect.lua reads of the row: the record's fields, its
// TTL, the lease as the lock (there is no waiters flag: waiters poll),
// judged interrupted against the claim horizon on the database's clock.
func (r *sqlRow) state(id string, horizon time.Duration) State {
	s := State{Key: id, State: "none", Lock: r.holder}
	if r.record != "" {
		s.TTL = time.Duration(r.recordUntil-r.now) * time.Microsecond
		if rec, ok := ParseRecord(r.record); !ok {
			s.State = "corrupt"
		} else {
			if rec.State != "forgotten" {
				s.State = rec.State
			}
			s.Owner, s.Fingerprint = rec.Owner, rec.Fingerprint
			s.Status, _ = strconv.Atoi(rec.Status)
			s.Executions, _ = strconv.ParseInt(rec.Executions, 10, 64)
			s.Fence, _ = strconv.ParseUint(rec.Fence, 10, 64)
			s.BodySize = int64(len(rec.Body))
		}
	}
	if r.holder != "" {
		s.LockTTL = time.Duration(r.holderUntil-r.now) * time.Microsecond
	}
	s.Interrupted = interrupted(s, r.now, horizon)
	return s
}

// inspect reads the row of the record named id.
func (q *SQLRows) inspect(ctx context.Context, id string, horizon time.Duration) (State, error) {
	var (
		r      sqlRow
		record []byte
	)
	row := q.DB.QueryRowContext(ctx, q.statement("SELECT record, "+rowColumns+" FROM TABLE WHERE id = ?"), id)
	err := r.scan(row.Scan, &record)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return State{Key: id, State: "none"}, nil
	case err != nil:
		return State{}, q.tableError(err)
	}
	r.read(record)
	return r.state(id, horizon), nil
}

// interrupted yields the interrupted keys under prefix, a page of rows
// (in the order of their ids) per step.
func (q *SQLRows) interrupted(ctx context.Context, prefix string, horizon time.Duration) iter.Seq2[State, error] {
	return func(yield func(State, error) bool) {
		// LIKE narrows the walk to the prefix's rows (SQLite's ignores
		// case, so Parse decides); the ids' own order pages it, whatever
		// the column's collation.
		page := q.statement("SELECT id, substr(record, 1, " + strconv.Itoa(peek) + "), " + rowColumns +
			" FROM TABLE WHERE id > ? AND id LIKE ? ESCAPE '!' AND record_until > NOW ORDER BY id LIMIT " +
			strconv.Itoa(sqlPage))
		like := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(prefix) + ":{%}:r%"
		for after := ""; ; {
			states, last, n, err := q.page(ctx, page, prefix, after, like, horizon)
			if err != nil {
				yield(State{}, err)
				return
			}
			for _, s := range states {
				if !yield(s, nil) {
					return
				}
			}
			if n < sqlPage {
				return
			}
			after = last
		}
	}
}

// page reads one page of rows after the id after, and returns the
// interrupted keys among them, the page's last id and its length.
func (q *SQLRows) page(ctx context.Context, query, prefix, after, like string, horizon time.Duration) (found []State, last string, n int, err error) {
	rows, err := q.DB.QueryContext(ctx, query, after, like)
	if err != nil {
		return nil, "", 0, q.tableError(err)
	}
	defer rows.Close()
	var unsure []string // run records whose line is longer than the peek
	for rows.Next() {
		var (
			r    sqlRow
			head []byte
		)
		if err := r.scan(rows.Scan, &last, &head); err != nil {
			return nil, "", 0, q.tableError(err)
		}
		n++
		if k, err := Parse(prefix, last); err != nil || k.Record != last || !strings.HasPrefix(string(head), "run ") {
			continue // not this prefix's record, or not claimed: never interrupted
		}
		if _, ok := ParseRecord(string(head)); !ok {
			unsure = append(unsure, last)
			continue
		}
		r.read(head)
		if s := r.state(last, horizon); s.Interrupted {
			found = append(found, s)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, "", 0, q.tableError(err)
	}
	for _, id := range unsure {
		s, err := q.inspect(ctx, id, horizon)
		if err != nil {
			return nil, "", 0, err
		}
		if s.Interrupted {
			found = append(found, s)
		}
	}
	return found, last, n, nil
}

// settle is settle.lua on the row of the record named id, in one
// transaction: its reply word.
func (q *SQLRows) settle(ctx context.Context, id string, a settlement) (string, error) {
	if q.Serial != nil {
		q.Serial.Lock()
		defer q.Serial.Unlock()
	}
	for range 5 {
		reply, err := q.settleTx(ctx, id, a)
		if !sqldialect.Retryable(err) {
			return reply, q.tableError(err)
		}
	}
	return "", errSQLRetries
}

func (q *SQLRows) settleTx(ctx context.Context, id string, a settlement) (reply string, err error) {
	tx, err := q.DB.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	read := "SELECT record, " + rowColumns + " FROM TABLE WHERE id = ?"
	if q.Dialect == sqldialect.SQLite {
		// A write first takes SQLite's write lock, which the transaction
		// then holds until it ends: a claim in another process waits for
		// it, rather than the row changing between the read and the write.
		if _, err = tx.ExecContext(ctx, q.statement("UPDATE TABLE SET id = id WHERE id = ?"), id); err != nil {
			return "", err
		}
	} else {
		read += " FOR UPDATE"
	}
	var (
		r      sqlRow
		record []byte
	)
	row := tx.QueryRowContext(ctx, q.statement(read), id)
	switch err = r.scan(row.Scan, &record); {
	case errors.Is(err, sql.ErrNoRows):
		err = nil
	case err != nil:
		return "", err
	default:
		r.read(record)
	}
	reply, text, until := r.settle(a)
	if text != "" {
		if _, err = tx.ExecContext(ctx, q.statement("UPDATE TABLE SET record = ?, record_until = ? WHERE id = ?"),
			[]byte(text), until, id); err != nil {
			return "", err
		}
	}
	return reply, tx.Commit()
}

// A settlement is what an operator settles a key with (settle.lua's
// ARGV): forget, or store an answer, for the claim under owner.
type settlement struct {
	forget  bool
	owner   string
	ttl     time.Duration // the record's life, when it has none
	horizon time.Duration // the claim horizon: a younger claim may still store
	// The answer: the record's state, status, header block and body, and
	// the fingerprint ("" keeps the record's).
	state, status, header, body, fingerprint string
}

// mark is what the settle leaves in the record's last field, and the
// state it leaves: the same answer for the same claim marks alike, so
// that a settle sent again finds its own work done.
func (a settlement) mark() (mark, left string) {
	if a.forget {
		return "f:" + a.owner, "forgotten"
	}
	var b strings.Builder
	for _, part := range []string{a.state, a.status, a.header, a.body, a.fingerprint} {
		b.WriteString(strconv.Itoa(len(part)) + ":" + part)
	}
	sum := sha1.Sum([]byte(b.String()))
	return "a:" + hex.EncodeToString(sum[:])[:16] + ":" + a.owner, a.state
}

// settle is settle.lua on the row: its reply, and the record to write
// with its expiry ("" for none).
func (r *sqlRow) settle(a settlement) (reply, text string, until int64) {
	var rec Record
	if r.record != "" {
		var ok bool
		if rec, ok = ParseRecord(r.record); !ok {
			return "corrupt", "", 0
		}
	}
	mark, left := a.mark()
	switch {
	case rec.State != "" && rec.State == left && rec.Settled == mark:
		return "settled", "", 0
	case rec.State == "" || rec.State == "forgotten":
		return "none", "", 0
	case rec.State != "run":
		return rec.State, "", 0
	case r.holder != "" && r.holder == rec.Owner:
		return "running", "", 0
	case rec.Owner != a.owner:
		return "changed", "", 0
	case mayStillStore(rec.Owner, fenceOf(rec), r.now, a.horizon):
		return "young", "", 0
	}
	until = r.recordUntil
	if until <= r.now {
		until = r.now + a.ttl.Microseconds()
	}
	if a.forget {
		// A token-mode key's token is not given back, as on Redis.
		return "settled", Record{State: "forgotten", Settled: mark}.String(), until
	}
	if a.fingerprint != "" && a.fingerprint != rec.Fingerprint {
		return "mismatch", "", 0
	}
	// The fence and the executions stay; the executor goes.
	return "settled", Record{State: a.state, Fingerprint: rec.Fingerprint, Fence: rec.Fence,
		Executions: rec.Executions, PrevOwner: rec.PrevOwner, PrevFence: rec.PrevFence,
		WrittenBack: rec.WrittenBack, Settled: mark, Status: a.status, Header: a.header, Body: a.body}.String(), until
}

// tableError says which table a failed statement read.
func (q *SQLRows) tableError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("admin: the keys table %s: %w", q.Table, err)
}

// fenceOf is the record's fence: its claim's time on the database's clock.
func fenceOf(rec Record) int64 {
	f, _ := strconv.ParseInt(rec.Fence, 10, 64)
	return f
}
