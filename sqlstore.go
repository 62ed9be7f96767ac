package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/sqldialect"
)

// SQLDialect is the SQL flavour of the database NewSQL keeps keys in: the
// same value as sqlidem's and optimistic's Dialect.
type SQLDialect = sqldialect.Dialect

// The databases NewSQL speaks to.
const (
	// SQLite, for the processes of one machine, on a local file: a
	// process runs one operation of the store at a time, and SQLite's file
	// lock orders the processes' transactions. Open it with a busy timeout
	// (modernc.org/sqlite: ?_pragma=busy_timeout(5000)), and in WAL mode
	// so that duplicates read while a claim writes.
	SQLite = sqldialect.SQLite
	// PostgreSQL.
	PostgreSQL = sqldialect.PostgreSQL
	// MySQL and MariaDB (InnoDB).
	MySQL = sqldialect.MySQL
)

// DefaultSQLTable is the table NewSQL keeps keys in unless WithSQLTable
// names another.
const DefaultSQLTable = "idempotency_keys"

// NewSQL returns a Middleware that keeps its keys in db, a PostgreSQL,
// MySQL/MariaDB or (on one machine) SQLite database, with no Redis at
// all: every promise of New holds, each Redis script becoming one
// transaction on the key's row. It creates its table (DefaultSQLTable, or
// WithSQLTable's) when it first reaches the database, and purges expired
// rows as it goes, with no job of its own to schedule.
//
// A waiting duplicate polls (50 ms, growing to 500 ms), or on PostgreSQL
// is told when the key's holder lets go (WithSQLListener). WithReplicaAcks
// has no meaning (use the database's own synchronous replication). The
// operator's package admin and idemctl -store read and settle the table.
// It panics when an option is
// invalid, as New does; a database that does not answer is 503
// store-unavailable per request, not a failure at start-up.
func NewSQL(db *sql.DB, dialect SQLDialect, opts ...Option) *Middleware {
	if db == nil {
		panic("idempotency: nil database")
	}
	if !dialect.Valid() {
		panic(fmt.Sprintf("idempotency: NewSQL: unknown dialect %v", dialect))
	}
	m := newMiddleware(opts)
	if m.cfg.replicaAcks > 0 {
		panic("idempotency: WithReplicaAcks waits for Redis replicas; NewSQL keeps keys in a database, " +
			"whose own synchronous replication does that")
	}
	table := m.cfg.sqlTable
	if table == "" {
		table = DefaultSQLTable
	}
	if !sqldialect.ValidName(table, dialect != SQLite) {
		panic(fmt.Sprintf("idempotency: WithSQLTable(%q): not a table name", table))
	}
	if m.cfg.sqlListener != nil && dialect != PostgreSQL {
		panic("idempotency: WithSQLListener: only PostgreSQL notifies; on " + dialect.String() + " waiting duplicates poll")
	}
	if p := m.cfg.prefix; len(p) > maxSQLPrefix || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
		// A key's id is its Redis name, prefix first: a column of text
		// takes neither a NUL nor invalid UTF-8, and MySQL's holds 512
		// bytes. Refused here, every request would answer 503.
		panic(fmt.Sprintf("idempotency: NewSQL: WithKeyPrefix(%q) must be UTF-8 without NUL, at most %d bytes",
			p, maxSQLPrefix))
	}
	s := newSQLStore(db, dialect, table, &m.cfg)
	if l := m.cfg.sqlListener; l != nil {
		s.notify = newNotifyRoom(l, table, &m.cfg)
	}
	m.keyStore = s
	m.outage.store = "the database"
	remember(m)
	return m
}

// maxSQLPrefix bounds a key prefix under NewSQL: with the rest of a key's
// id (a scope's digest and an issued token, under 100 bytes) it fits the
// id column everywhere.
const maxSQLPrefix = 256

// WithSQLTable names the table NewSQL keeps keys in (DefaultSQLTable when
// not set): a name, or schema.name. Two middlewares that share a database
// and a key prefix may share it.
func WithSQLTable(name string) Option { return func(c *config) { c.sqlTable = name } }

// sqlStore keeps keys in a database: one row per key, the record and the
// lease in it (keyRow). The common cases are one statement each: a fresh
// key's claim an INSERT, a finished key's duplicate a SELECT, the store of
// an answer over the claim as it was written an UPDATE. Every other
// operation is one transaction that reads the row under a lock (SELECT …
// FOR UPDATE; SQLite's write lock, and one operation at a time per
// process) and writes it back when it changed.
type sqlStore struct {
	db      *sql.DB
	dialect SQLDialect
	table   string
	cfg     *config
	q       sqlStatements
	serial  sync.Mutex  // SQLite: one operation at a time
	notify  *notifyRoom // WithSQLListener's, or nil: waiters poll
	line    *holderLine // db's, for runs that hold a lease; nil on SQLite

	schema    sync.Mutex
	ready     atomic.Bool  // the table exists
	lastPurge atomic.Int64 // unix nanoseconds of the last purge
	// maxStatement is the largest statement the server takes (MySQL's
	// max_allowed_packet, read with the table; 0: no limit we know of).
	maxStatement int
}

func newSQLStore(db *sql.DB, d SQLDialect, table string, cfg *config) *sqlStore {
	s := &sqlStore{db: db, dialect: d, table: table, cfg: cfg, q: statementsFor(d, d.Quote(table), sqlChannel(table))}
	if d != SQLite { // its one write lock, not a pool, is what statements wait for
		s.line = holderLineOf(db, cfg.logger)
	}
	return s
}

// ensureTable creates the table the first time the database answers.
func (s *sqlStore) ensureTable(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	s.schema.Lock()
	defer s.schema.Unlock()
	if s.ready.Load() {
		return nil
	}
	var err error
	// Instances that start together race to create the table, and
	// PostgreSQL may refuse the loser's CREATE ... IF NOT EXISTS (a
	// duplicate type): its next attempt finds the table.
	for range 3 {
		if err = s.createTable(ctx); err == nil {
			if s.dialect == MySQL {
				s.db.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&s.maxStatement)
			}
			s.ready.Store(true)
			s.purgeNow() // what an earlier run left to expire
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("idempotency: creating the keys table: %w", err)
}

// indexThere reports whether the record_until index is known to exist;
// false where the dialect cannot say at no cost.
func (s *sqlStore) indexThere(ctx context.Context) bool {
	var there bool
	return s.q.indexed != "" && s.db.QueryRowContext(ctx, s.q.indexed).Scan(&there) == nil && there
}

func (s *sqlStore) createTable(ctx context.Context) error {
	// The table's CREATE ... IF NOT EXISTS takes no lock when it is
	// there; the index's does (sqlStatements.indexed).
	create := []string{s.q.create}
	if s.q.index != "" && !s.indexThere(ctx) {
		create = append(create, s.q.index)
	}
	for _, stmt := range create {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil && !sqldialect.DuplicateIndex(err) {
			return err
		}
	}
	if s.q.waiting != "" {
		// A table an earlier version created has no waiting_until. Looked
		// for first: the ALTER locks the whole table, even when it finds
		// the column there.
		rows, err := s.db.QueryContext(ctx, "SELECT waiting_until FROM "+s.dialect.Quote(s.table)+" WHERE false")
		if err == nil {
			return rows.Close()
		}
		if _, err := s.db.ExecContext(ctx, s.q.waiting); err != nil {
			return err
		}
	}
	return nil
}

// errSQLRetries: a transaction met a deadlock or a serialization failure
// too many times in a row.
var errSQLRetries = errors.New("idempotency: the database kept refusing the transaction as a conflict")

// withRow runs fn on the key's row in one transaction, read under a lock,
// and writes the row back when fn changed it. A transaction the database
// refuses as a conflict (a deadlock, a serialization failure) runs again:
// nothing of it was written.
func (s *sqlStore) withRow(ctx context.Context, c sqlConn, id string, fn func(r *keyRow)) error {
	if err := s.ensureTable(ctx); err != nil {
		return err
	}
	s.purgeNow()
	if s.dialect == SQLite {
		s.serial.Lock()
		defer s.serial.Unlock()
	}
	for range 5 {
		err := s.rowTx(ctx, c, id, fn)
		// No row after the insert: a purge deleted it between the two.
		if !sqldialect.Retryable(err) && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	return errSQLRetries
}

func (s *sqlStore) rowTx(ctx context.Context, c sqlConn, id string, fn func(r *keyRow)) (err error) {
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	// The row exists before it is locked, so that two claims of a fresh
	// key queue on one row lock rather than both insert.
	if _, err = tx.ExecContext(ctx, s.q.insert, id); err != nil {
		return err
	}
	var r keyRow
	if err = s.scanRow(tx.QueryRowContext(ctx, s.q.lock, id), &r); err != nil {
		return err
	}
	holder := r.holder
	fn(&r)
	if r.changed {
		var record any // NULL for none
		if r.record != "" {
			record = []byte(r.record)
		}
		if _, err = tx.ExecContext(ctx, s.q.update, record, r.recordUntil, r.holder, r.holderUntil, id); err != nil {
			return err
		}
		if r.waiting && holder != "" && r.holder != holder {
			// Sent when the transaction commits.
			if _, err = tx.ExecContext(ctx, s.q.notify, id); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

// scanRow reads a row as the store's statements select it, and drops what
// has expired: a record past its life, a lease past its end.
func (s *sqlStore) scanRow(row *sql.Row, r *keyRow) error {
	var record []byte
	var waitingUntil int64
	if err := row.Scan(&record, &r.recordUntil, &r.holder, &r.holderUntil, &waitingUntil, &r.now); err != nil {
		return err
	}
	r.waiting = waitingUntil > r.now
	if r.recordUntil > r.now {
		r.record = string(record)
	} else {
		r.recordUntil = 0
	}
	if r.holderUntil <= r.now {
		r.holder, r.holderUntil = "", 0
	}
	return nil
}

// claim runs keyRow.claim. A key with no row (the common first
// execution) is claimed by one INSERT; a key whose record is finished (the
// common duplicate) is answered by one SELECT, without a transaction:
// nothing changes a finished record but its expiry. Every other claim is
// a transaction on the row.
func (s *sqlStore) claim(ctx context.Context, k keys, lockValue, fingerprint string) (cl claim, err error) {
	if s.line == nil { // SQLite: the process's lock, not the pool, orders its statements
		return s.claimRow(ctx, s.db, k, lockValue, fingerprint)
	}
	if err := s.ensureTable(ctx); err != nil {
		return claim{}, poolNamed(s.db, err)
	}
	s.line.claiming(s.cfg.lease)
	for attempt := 1; ; attempt++ {
		var dead bool
		cl, dead, err = s.claimOn(ctx, k, lockValue, fingerprint)
		// A connection the server had ended, so that the statement never
		// ran (a database restarted, an idle connection terminated):
		// another is tried, as database/sql tries its pool's. A statement
		// of the claim that ran before it is met as our own claim resent
		// (keyRow.claim). A reply lost with its connection is not such a
		// case: the claim is undone in the background, and the request
		// refused.
		if !dead || ctx.Err() != nil || attempt == maxDeadConnAttempts {
			return cl, poolNamed(s.db, err)
		}
	}
}

// maxDeadConnAttempts bounds the connections one claim tries that turn out
// ended.
const maxDeadConnAttempts = 3

// claimOn runs the claim's statements on one connection, whose wait for
// the pool its lease does not count: a claim that queued behind the
// handlers' transactions took no lease meanwhile. The connection then
// stays with the line if the line wants one (holderLine.takes). dead: the
// claim failed because the server had ended its connection, and ran
// nothing.
func (s *sqlStore) claimOn(ctx context.Context, k keys, lockValue, fingerprint string) (cl claim, dead bool, err error) {
	asked := time.Now()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return claim{}, false, err
	}
	queued := time.Since(asked)
	cl, err = s.claimRow(ctx, conn, k, lockValue, fingerprint)
	cl.queued = queued
	dead = err != nil && (errors.Is(err, driver.ErrBadConn) || connectionEnded(err))
	s.line.keepOrGiveBack(conn, err)
	return cl, dead, err
}

func (s *sqlStore) claimRow(ctx context.Context, c sqlConn, k keys, lockValue, fingerprint string) (claim, error) {
	s.purgeNow()
	token, life, abandoned, expires := s.cfg.claimTerms(k)
	ask := claimAsk{lockValue: lockValue, fingerprint: fingerprint, token: token, abandoned: abandoned,
		life: life.Microseconds(), horizon: s.cfg.claimHorizon().Microseconds(), lease: s.cfg.lease.Microseconds(),
		expires: expires}
	if s.ready.Load() {
		if token != "r" { // a lookup claims nothing without a record
			fence, err := s.claimFresh(ctx, c, k, ask)
			switch {
			case err != nil:
				return claim{}, err
			case fence != 0:
				return claim{outcome: outcomeClaimed, fence: fence}, nil
			}
		}
		var r keyRow
		err := s.scanRow(c.QueryRowContext(ctx, s.q.read, k.record), &r)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return claim{}, err
		default:
			// A claim that writes nothing (a replay, a refusal, a key held
			// or still running, our own claim resent) needs no lock: a
			// waiting duplicate polls without queueing on the row.
			if found := r.claim(ask); !r.changed {
				return found.read(s.cfg, k)
			}
		}
	}
	var found claimFound
	if err := s.withRow(ctx, c, k.record, func(r *keyRow) { found = r.claim(ask) }); err != nil {
		return claim{}, err
	}
	return found.read(s.cfg, k)
}

// claimFresh claims a key that has no row in one statement, as
// keyRow.claim would claim it, and returns its fence; 0 when the key has a
// row, which then decides, or its token expired on the database's clock,
// which keyRow.claim then says. MySQL has no RETURNING, and with
// clientFoundRows it counts a row it found as affected: there the INSERT
// only writes, and the read that follows finds the claim ours (its record
// and lease under our fresh lock value) or another's.
func (s *sqlStore) claimFresh(ctx context.Context, c sqlConn, k keys, a claimAsk) (uint64, error) {
	before, after := keyspace.ClaimLineAround(a.fingerprint, a.lockValue)
	until := int64(math.MaxInt64) // a key with no token claims at any time
	if a.expires != 0 {
		until = a.expires
	}
	args := []any{k.record, before, after, a.life, a.lockValue, a.lease, until}
	if s.dialect == SQLite {
		s.serial.Lock()
		defer s.serial.Unlock()
	}
	if !s.q.freshReturns {
		_, err := c.ExecContext(ctx, s.q.fresh, args...)
		return 0, err
	}
	var fence uint64
	err := c.QueryRowContext(ctx, s.q.fresh, append(args, a.life)...).Scan(&fence)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return fence, err
}

// statementRoom is what a store's statement holds beside its two record
// texts: the SQL, the other arguments, the protocol's framing.
const statementRoom = 4 << 10

// complete stores the answer. Over the record as the claim wrote it (the
// common case) that is one conditional UPDATE; otherwise keyRow.complete
// decides, in a transaction.
func (s *sqlStore) complete(ctx context.Context, k keys, lockValue *string, fp string, fence uint64, rec *record, ttl time.Duration) (completion, error) {
	if err := s.ensureTable(ctx); err != nil {
		return 0, err
	}
	texts := s.completionTexts(k, fp, *lockValue, fence, rec)
	stored, claimed := texts.buf[texts.claimed:], texts.buf[:texts.claimed]
	life := k.lifetime(ttl).Microseconds()
	var done completion
	err := s.asHolder(ctx, func(c sqlConn) error {
		n, err := s.changeRow(ctx, c, s.q.store, stored, life, *lockValue, *lockValue, k.record, claimed)
		if err != nil || n == 1 {
			done = completed
			return err
		}
		var result int
		err = s.withRow(ctx, c, k.record, func(r *keyRow) {
			result = r.complete(*lockValue, string(stored), string(claimed), life)
		})
		switch {
		case err != nil:
			return err
		case result == 0:
			return ErrLockLost
		case result == 2:
			done = rewritten
		default:
			done = completed
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return done, nil
}

// completionTexts are the texts that store rec over the claim. An answer
// the server would refuse in one statement (MySQL's max_allowed_packet,
// which closes the connection every time it is tried) is stored as
// executed and not replayable, as one over WithMaxResponseBytes is.
func (s *sqlStore) completionTexts(k keys, fp, lockValue string, fence uint64, rec *record) *completionTexts {
	texts := newCompletionTexts(fp, lockValue, fence, rec)
	if s.maxStatement > 0 && rec != nil && 2*len(texts.buf)+statementRoom > s.maxStatement {
		s.cfg.logger.Warn("idempotency: the answer is larger than the database takes in one statement "+
			"(MySQL's max_allowed_packet); stored as not replayable", "key", k.record,
			"bytes", len(rec.body), "max_allowed_packet", s.maxStatement)
		texts = newCompletionTexts(fp, lockValue, fence, nil)
	}
	return texts
}

func (s *sqlStore) release(ctx context.Context, k keys, lockValue string) error {
	return s.rowAsHolder(ctx, k, func(r *keyRow) { r.release(lockValue) })
}

func (s *sqlStore) keep(ctx context.Context, k keys, lockValue string) error {
	return s.rowAsHolder(ctx, k, func(r *keyRow) { r.keep(lockValue) })
}

// rowAsHolder runs fn on the key's row (withRow) for the run that holds
// its lease.
func (s *sqlStore) rowAsHolder(ctx context.Context, k keys, fn func(r *keyRow)) error {
	return s.asHolder(ctx, func(c sqlConn) error { return s.withRow(ctx, c, k.record, fn) })
}

// renew extends a lease we hold with one UPDATE (a watchdog renews every
// third of a lease while the work runs); only a lapsed lease, which
// keyRow.renew may take back, needs the row read in a transaction.
func (s *sqlStore) renew(ctx context.Context, k keys, lockValue string, retake bool) (bool, error) {
	lease := s.cfg.lease.Microseconds()
	if s.ready.Load() {
		var n int64
		err := s.asHolder(ctx, func(c sqlConn) (err error) {
			n, err = s.serialized(func() (int64, error) {
				return rowsAffected(c.ExecContext(ctx, s.q.renew, lease, k.record, lockValue))
			})
			return err
		})
		switch {
		case err != nil:
			return false, err
		case n == 1:
			return true, nil
		case !retake:
			return false, nil // not ours: held by another, or lapsed
		}
	}
	var ours bool
	err := s.rowAsHolder(ctx, k, func(r *keyRow) { ours = r.renew(lockValue, lease, retake) })
	return ours, err
}

// unlock lets our lease go with one UPDATE: the record is not read.
func (s *sqlStore) unlock(ctx context.Context, k keys, lockValue string) error {
	if err := s.ensureTable(ctx); err != nil {
		return err
	}
	return s.asHolder(ctx, func(c sqlConn) error {
		_, err := s.serialized(func() (int64, error) {
			return s.changeRow(ctx, c, s.q.unlock, k.record, lockValue)
		})
		return err
	})
}

// changeRow runs an UPDATE of one row that may notify its waiters (store,
// unlock) on c and returns how many rows it changed.
func (s *sqlStore) changeRow(ctx context.Context, c sqlConn, update string, args ...any) (int64, error) {
	if !s.q.notifies {
		return rowsAffected(c.ExecContext(ctx, update, args...))
	}
	var changed, notified int64
	err := c.QueryRowContext(ctx, update, args...).Scan(&changed, &notified)
	return changed, err
}

// serialized runs one statement, under the process's lock on SQLite.
func (s *sqlStore) serialized(statement func() (int64, error)) (int64, error) {
	if s.dialect == SQLite {
		s.serial.Lock()
		defer s.serial.Unlock()
	}
	return statement()
}

func (s *sqlStore) journal(ctx context.Context, k keys, lockValue string, entry []byte, before int) (runProof, error) {
	var retake int64
	if !s.cfg.takeover() {
		retake = s.cfg.lease.Microseconds() // as for Redis: a live run takes its lapsed lease back
	}
	var p runProof
	err := s.rowAsHolder(ctx, k, func(r *keyRow) {
		owned, left := r.step(lockValue, string(entry), before, retake)
		p = runProof{owned: owned, left: time.Duration(left) * time.Millisecond}
	})
	return p, err
}

// watch joins the listener's room (WithSQLListener) and marks the key's
// row as waited for until the wait ends, so that its holder notifies when
// it lets go. Without a listener, waiters poll.
func (s *sqlStore) watch(ctx context.Context, k keys, until time.Duration) (*watcher, error) {
	if s.notify == nil {
		return nil, nil
	}
	w, listening := s.notify.join(k.record)
	if w == nil {
		return nil, nil
	}
	// A listener that does not listen yet (connecting, or failing to) is
	// not waited for past a first poll's pause: this waiter polls.
	timer := time.NewTimer(notifyConnectWait)
	defer timer.Stop()
	select {
	case <-listening:
	case <-timer.C:
		w.stop()
		return nil, nil
	case <-ctx.Done():
		w.stop()
		return nil, ctx.Err()
	}
	if !s.notify.ready() {
		w.stop()
		return nil, nil
	}
	if _, err := s.db.ExecContext(ctx, s.q.wait, max(until, time.Millisecond).Microseconds(), k.record); err != nil {
		w.stop()
		return nil, err
	}
	return w, nil
}

func (s *sqlStore) ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return err
	}
	return s.ensureTable(ctx)
}

// purgeEvery is how often an instance starts a purge of expired rows, and
// purgeBatch how many one statement deletes at most: a purge never holds
// many row locks at once. A purge that deleted a full batch goes on with
// the next, up to purgeBatches in all (100,000 rows a minute per
// instance), so that the table keeps pace with the keys that expire.
const (
	purgeEvery   = time.Minute
	purgeBatch   = 1000
	purgeBatches = 100
)

// purgeNow starts a purge in the background when the last one is
// purgeEvery old.
func (s *sqlStore) purgeNow() {
	if !s.ready.Load() {
		return // ensureTable starts the first once the table exists
	}
	last := s.lastPurge.Load()
	now := time.Now().UnixNano()
	if now-last < int64(purgeEvery) || !s.lastPurge.CompareAndSwap(last, now) {
		return
	}
	go func() {
		for range purgeBatches {
			deleted, err := s.purgeOnce()
			if err != nil {
				s.cfg.logger.Warn("idempotency: purging expired keys failed; the next purge tries again", "error", err)
				return
			}
			if deleted < purgeBatch {
				return
			}
		}
	}()
}

// purgeOnce deletes one batch, within ten store timeouts, trying again
// what the database refused as a conflict.
func (s *sqlStore) purgeOnce() (deleted int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.storeTimeout)
	defer cancel()
	if s.dialect == SQLite {
		s.serial.Lock()
		defer s.serial.Unlock()
	}
	for range 3 {
		if deleted, err = s.purge(ctx); !sqldialect.Retryable(err) {
			break
		}
	}
	return deleted, err
}

// purge deletes up to purgeBatch expired rows. On PostgreSQL and MySQL it
// reads committed rows only: under MySQL's default repeatable read, the
// range it scans would lock the gaps that new keys' rows go into, and
// claims would wait for it.
func (s *sqlStore) purge(ctx context.Context) (int64, error) {
	if s.dialect == SQLite {
		return rowsAffected(s.db.ExecContext(ctx, s.q.purge))
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	n, err := rowsAffected(tx.ExecContext(ctx, s.q.purge))
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	return n, tx.Commit()
}

// rowsAffected is how many rows a statement changed.
func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
