package sqlidem

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/sqldialect"
)

// DefaultTable is the outcome table's name unless WithTable names another.
const DefaultTable = "idempotency_outcomes"

// A Store keeps protected handlers' answers in a SQL table, committed in
// the same transaction as the handlers' own writes (see Handler). It is an
// idempotency.OutcomeStore: give it to the middleware with
// idempotency.WithOutcomeStore, and an abandoned execution is recovered
// from it instead of being answered 409 interrupted.
//
// The table holds one row per key:
//
//	record_key   the key's Redis record name, prefix and all
//	             (idempotency.Execution.Key)
//	fingerprint  the request's fingerprint, hex ('' in a fence row)
//	fence        the fencing token of the execution that wrote the row
//	state        'done': an answer committed with the handler's writes;
//	             'executed': the writes committed, and the answer was too
//	             large to keep (status only; replays answer
//	             idempotency.ErrNotReplayable);
//	             'fenced': nothing committed, and executions with a lower
//	             fence may no longer commit (written by recovery);
//	             'unknown': the work committed or rolled back its
//	             transaction itself, so whether it committed is unknown
//	             (see ErrOutcomeUnknown)
//	status, header (JSON), body   the answer ('done' rows)
//	written_ms   when the row was written, Unix milliseconds (see Purge)
//
// A Store is safe for concurrent use.
type Store struct {
	db        *sql.DB
	dialect   Dialect
	table     string
	onError   func(http.ResponseWriter, *http.Request, error)
	attempts  int // math.MaxInt: until the execution ends
	txOptions *sql.TxOptions

	// Statements, built once by New.
	ddl                                                       []string
	index                                                     string // the write-time index's name
	selectRow, insertAnswer, updateFenced, upsertFence, purge string

	// packet is MySQL's max_allowed_packet, once read (see fits).
	packet atomic.Int64
}

// The row's states.
const (
	stateDone     = "done"     // an answer, committed with the work
	stateExecuted = "executed" // the work committed; its answer was too large to keep
	stateFenced   = "fenced"   // nothing committed; lower fences may not commit
	stateUnknown  = "unknown"  // the work ended its transaction itself: committed or not, nobody knows
)

// An Option configures a Store.
type Option func(*Store)

// WithTable names the outcome table (default DefaultTable), optionally
// qualified by a schema.
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithErrorHandler sets what answers a request whose transaction did not
// commit: err wraps idempotency.ErrStoreUnavailable when the database
// failed, idempotency.ErrInProgress when a newer execution owns the key or
// the run's lease was lost, idempotency.ErrKeyReused when the key's
// committed answer is another request's, idempotency.ErrUnreadableRecord
// when that answer cannot be read, and is the handler's own error
// otherwise. Default idempotency.WriteError: the error handler of the
// middleware that protects the route (DefaultErrorHandler unless it was
// given another), which never shows err's text. Whatever the handler,
// err is reported to the middleware first (idempotency.ReportError): it
// logs a failure once, with its text, and its observer sees it.
func WithErrorHandler(fn func(http.ResponseWriter, *http.Request, error)) Option {
	return func(s *Store) { s.onError = fn }
}

// WithAttempts bounds how many times, in all, an execution's transaction
// runs when the database aborts it as a serialization failure or a
// deadlock (SQLSTATE 40001 or 40P01, MySQL error 1213, SQLITE_BUSY), in
// the TxFunc, at the outcome row or at COMMIT: such a transaction
// committed nothing, and runs again from BEGIN after a short, jittered
// pause that grows with each attempt. When the last attempt is aborted
// too, the request is answered idempotency.ErrStoreUnavailable (503 with
// Retry-After) and its key released, so that the client's retry runs.
// Default: no bound but the execution's own end (the middleware's
// WithExecutionTimeout, Do's context), for contention is not
// unavailability; 1 runs each transaction once.
func WithAttempts(n int) Option { return func(s *Store) { s.attempts = n } }

// WithIsolation sets the isolation level of every transaction the Store
// begins (sql.LevelSerializable, for instance, for handlers whose reads
// decide their writes). Default the database's own: READ COMMITTED on
// PostgreSQL, REPEATABLE READ on MySQL, SERIALIZABLE on SQLite (whose
// driver takes no other). The outcome row works at every level; a level
// that aborts more transactions costs attempts (WithAttempts).
func WithIsolation(level sql.IsolationLevel) Option {
	return func(s *Store) { s.txOptions = &sql.TxOptions{Isolation: level} }
}

// New returns a Store on db, which speaks dialect. It checks the options,
// not the database: call CreateTable, or create the table yourself from
// the DDL CreateTable runs.
func New(db *sql.DB, dialect Dialect, opts ...Option) (*Store, error) {
	s := &Store{db: db, dialect: dialect, table: DefaultTable, onError: idempotency.WriteError, attempts: math.MaxInt}
	for _, opt := range opts {
		opt(s)
	}
	switch {
	case db == nil:
		return nil, errors.New("sqlidem: nil *sql.DB")
	case s.attempts < 1:
		return nil, fmt.Errorf("sqlidem: WithAttempts(%d): a transaction runs at least once", s.attempts)
	case !dialect.Valid():
		return nil, fmt.Errorf("sqlidem: unknown dialect %v", dialect)
	case !sqldialect.ValidName(s.table, true):
		return nil, fmt.Errorf("sqlidem: invalid table name %q: use letters, digits and underscores, "+
			"not starting with a digit, and at most one dot for a schema", s.table)
	}
	t, d := dialect.Quote(s.table), dialect
	s.index = indexName(s.table)
	s.ddl = ddl(d, t, s.index)
	s.selectRow = d.Bind("SELECT state, fingerprint, fence, status, header, body FROM " + t + " WHERE record_key = ?")
	s.insertAnswer = d.Bind("INSERT INTO " + t +
		" (record_key, fingerprint, fence, state, status, header, body, written_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
	s.updateFenced = d.Bind("UPDATE " + t + " SET fingerprint = ?, fence = ?, state = ?, status = ?, header = ?, body = ?, written_ms = ?" +
		" WHERE record_key = ? AND state = 'fenced' AND fence <= ?")
	s.upsertFence = fenceUpsert(d, t)
	s.purge = purgeStatement(d, t, s.index)
	return s, nil
}

// CreateTable creates the outcome table, and its index on the write time
// (for Purge), if they do not exist. Every instance may call it at
// start-up, all at once: on PostgreSQL, where two sessions that create the
// same table at the same moment collide (CREATE … IF NOT EXISTS included),
// the calls take turns under an advisory lock. A table that an earlier
// version created without the index gets it.
//
// On a table that has its index already, it only reads the catalog: DDL on
// an existing table takes a lock on it (PostgreSQL's CREATE INDEX IF NOT
// EXISTS locks the table before it finds the index), which would queue
// behind every running commit and hold up every later one, for as long as
// the slowest commit takes.
func (s *Store) CreateTable(ctx context.Context) error {
	if ready, err := s.tableReady(ctx); err != nil || ready {
		return err
	}
	switch s.dialect {
	case PostgreSQL:
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", ddlLock(s.table)); err != nil {
			return err
		}
		for _, q := range s.ddl {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return tx.Commit()
	case MySQL:
		if _, err := s.db.ExecContext(ctx, s.ddl[0]); err != nil {
			return err
		}
		return s.indexMySQL(ctx)
	}
	for _, q := range s.ddl {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// tableReady reports whether the outcome table and its write-time index
// exist, from the catalog, which takes no lock on the table. SQLite has
// no lock to spare (a writer holds the whole file): it reports false.
func (s *Store) tableReady(ctx context.Context) (bool, error) {
	schema, table, qualified := strings.Cut(s.table, ".")
	if !qualified {
		schema, table = "", s.table
	}
	var n int
	switch s.dialect {
	case PostgreSQL:
		index := s.index
		if qualified {
			index = schema + "." + index
		}
		err := s.db.QueryRowContext(ctx, "SELECT (to_regclass($1) IS NOT NULL)::int + (to_regclass($2) IS NOT NULL)::int",
			s.dialect.Quote(s.table), s.dialect.Quote(index)).Scan(&n)
		return n == 2, err
	case MySQL:
		err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.STATISTICS"+
			" WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?"+
			" AND COLUMN_NAME = 'written_ms' AND SEQ_IN_INDEX = 1", schema, table).Scan(&n)
		return n > 0, err
	}
	return false, nil
}

// ddlLock is the advisory lock that CreateTable takes on PostgreSQL: one
// per table name.
func ddlLock(table string) int64 {
	sum := sha256.Sum256([]byte("sqlidem DDL " + table))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// indexMySQL adds the write-time index to a MySQL table that lacks one (it
// was created before the index was part of the table).
func (s *Store) indexMySQL(ctx context.Context) error {
	if indexed, err := s.tableReady(ctx); err != nil || indexed {
		return err
	}
	_, err := s.db.ExecContext(ctx, createIndex(s.dialect, s.dialect.Quote(s.table), s.index))
	if sqldialect.DuplicateIndex(err) {
		return nil // another instance added it meanwhile
	}
	return err
}

// DDL returns the statements CreateTable runs, separated by ";\n", for
// migration tools: the table and its index on written_ms.
func (s *Store) DDL() string { return strings.Join(s.ddl, ";\n") }

// MaxKeyBytes is the most record_key holds: MySQL's VARBINARY(512), the
// same on every database so that a table means the same everywhere. A
// key longer than this (a long idempotency.WithKeyPrefix) is stored as
// its first 440 bytes, '~', and the SHA-256 of the whole key in base64url:
// still one row per key, never two keys cut short into one.
const MaxKeyBytes = 512

// rowKey is key as record_key holds it (see MaxKeyBytes).
func rowKey(key string) string {
	if len(key) <= MaxKeyBytes {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return key[:440] + "~" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// A Row is what the table holds for one key.
type Row struct {
	Done   bool // an answer was committed; otherwise a fence row
	Fence  uint64
	Answer idempotency.Answer // Done rows only; NotReplayable when it was too large to keep
	// Unknown: the work ended its transaction itself (ErrOutcomeUnknown).
	// Done is set too, and Answer is NotReplayable: the work may have
	// committed, so the key must not run again.
	Unknown bool
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Lookup returns the row of key (idempotency.Execution.Key, the Redis
// record's name), or ok false when it has none.
func (s *Store) Lookup(ctx context.Context, key string) (row Row, ok bool, err error) {
	return s.lookup(ctx, s.db, key)
}

func (s *Store) lookup(ctx context.Context, q querier, key string) (Row, bool, error) {
	var (
		state, fp, header string
		fence             int64
		status            int
		body              []byte
	)
	err := q.QueryRowContext(ctx, s.selectRow, rowKey(key)).Scan(&state, &fp, &fence, &status, &header, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, err
	}
	row := Row{Done: state != stateFenced, Fence: uint64(fence), Unknown: state == stateUnknown}
	if state != stateDone && state != stateFenced {
		row.Answer = idempotency.Answer{Status: status, Fingerprint: fp, NotReplayable: true}
		return row, true, nil
	}
	if row.Done {
		row.Answer = idempotency.Answer{Status: status, Body: body, Fingerprint: fp}
		if row.Answer.Header, err = decodeHeader([]byte(header)); err != nil {
			// The row holds an answer, which no retry can read: the
			// truthful answer is unreadable-record, not a store failure.
			return Row{}, false, fmt.Errorf("%w: sqlidem: header of %q: %w", idempotency.ErrUnreadableRecord, key, err)
		}
	}
	return row, true, nil
}

// packetMargin is room left in a MySQL packet for the statement around an
// answer's header and body.
const packetMargin = 64 << 10

// fits reports whether n bytes of an answer fit in one statement that the
// database takes. MySQL and MariaDB refuse a packet over max_allowed_packet
// (16 MiB by default on MariaDB, 4 MiB on older servers), every time; the
// variable is read once, through q (the transaction's own connection: a
// pool whose connections are all in transactions has no other).
// PostgreSQL and SQLite take a gigabyte.
func (s *Store) fits(ctx context.Context, q querier, n int) bool {
	if s.dialect != MySQL {
		return true
	}
	packet := s.packet.Load()
	if packet == 0 {
		if err := q.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&packet); err != nil || packet <= 0 {
			return true // unknown: the INSERT will tell
		}
		s.packet.Store(packet)
	}
	return int64(n)+packetMargin <= packet
}

// Recover implements idempotency.OutcomeStore: it returns the answer
// committed for key, or, when there is none, writes (or raises) the key's
// fence row to fence, after which an execution with a lower fence can no
// longer commit.
func (s *Store) Recover(ctx context.Context, key string, fence uint64) (idempotency.Answer, bool, error) {
	if row, ok, err := s.lookup(ctx, s.db, key); err != nil || (ok && row.Done) {
		return row.Answer, ok && row.Done, err
	}
	// The abandoned executor may have committed just before the fence, or
	// be committing now: the fence's write waits for its transaction.
	row, ok, err := s.fence(ctx, key, fence)
	switch {
	case err != nil:
		return idempotency.Answer{}, false, err
	case !ok:
		return idempotency.Answer{}, false, fmt.Errorf("sqlidem: fence row of %q vanished", key)
	case row.Done:
		return row.Answer, true, nil
	case row.Fence > fence:
		return idempotency.Answer{}, false, fmt.Errorf("sqlidem: %q is fenced by a newer execution (%d > %d)", key, row.Fence, fence)
	}
	return idempotency.Answer{}, false, nil
}

// fence writes the key's fence row at fence, or raises it to fence (a
// committed answer is never touched), and reads the row that results. The
// write waits for any transaction that holds the row, which has then
// committed or not.
func (s *Store) fence(ctx context.Context, key string, fence uint64) (Row, bool, error) {
	if _, err := s.db.ExecContext(ctx, s.upsertFence, rowKey(key), int64(fence), time.Now().UnixMilli()); err != nil {
		return Row{}, false, err
	}
	return s.lookup(ctx, s.db, key)
}

// Purge deletes the rows written before cutoff and reports how many went.
// Keep rows at least as long as Redis keeps records (idempotency's
// WithRecordTTL, 24 hours by default) and as long as clients may retry:
// a retry that finds neither replays nothing and runs again.
//
// It deletes the oldest rows first, a thousand per statement, through the
// index on written_ms, each statement its own transaction, and pauses
// between two as long as the last one took: the locks a statement holds
// (on MySQL, the rows it deletes and the index gaps between them; on
// SQLite, the database) are held that briefly, and commits waiting for
// the table go between. Run it from one instance, off the busy hours if
// there are many rows; an interrupted Purge (ctx) has deleted what it
// reports.
func (s *Store) Purge(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	for {
		began := time.Now()
		res, err := s.db.ExecContext(ctx, s.purge, cutoff.UnixMilli(), cutoff.UnixMilli())
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil || n < purgeBatch {
			return total, err
		}
		timer := time.NewTimer(min(max(time.Since(began), time.Millisecond), 100*time.Millisecond))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return total, context.Cause(ctx)
		}
	}
}
