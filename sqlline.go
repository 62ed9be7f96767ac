package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/onceonly/idempotency/sqldialect"
)

// sqlConn is what a store operation runs its statements on: db, that is
// its pool, or one connection of it (*sql.Conn).
type sqlConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// holderLine is one connection of a capped pool that the store keeps for
// the statements of runs that already hold their lease: renewals, the
// store of an answer, a release, a journal entry. Handlers' transactions
// share the pool (sqlidem's must), and when they take every connection,
// a renewal that queued behind them would wait past its lease: every lease
// lapses while the database is healthy, every run is cut, and
// WithRetryAbandoned runs the handlers again. Those statements take the
// line instead, one at a time, and only while the pool has no connection
// free; new claims still wait for the pool, which is what bounds the work
// in flight.
//
// Every Middleware of NewSQL on one *sql.DB shares its line. A claim
// fills it: the connection the claim got from the pool stays with the
// line, so that the line never waits behind the handlers it serves. It
// goes back to the pool once no key has been claimed for holderLineIdle,
// and a line whose connection broke is filled by the next claim. A pool
// without a limit needs no line (nothing waits for a connection), and one
// of fewer than minLinePool connections cannot spare it; either is logged
// once, at the first claim.
type holderLine struct {
	db     weak.Pointer[sql.DB] // live while a store on it is
	logger *slog.Logger

	turn   chan struct{} // held by the one operation on the connection
	claims atomic.Int64  // claims since the line was judged: it is in use
	active atomic.Bool   // judged: kept, or to be filled, or not needed
	want   atomic.Bool   // the next claim fills the line
	warned atomic.Bool   // a pool without a limit, or too small for a line, was logged
	mu     sync.Mutex
	conn   *sql.Conn // nil while none is kept
}

// holderLineIdle is how long a line stays without claims; minLinePool the
// smallest pool limit that spares a connection for it.
const (
	holderLineIdle = 30 * time.Second
	minLinePool    = 4
)

// holderLines are the lines by database. An entry does not keep its
// database alive (the line's connection does, while it is kept), and
// leaves with it.
var (
	holderLinesMu sync.Mutex
	holderLines   = map[weak.Pointer[sql.DB]]*holderLine{}
)

// holderLineOf is db's line, shared by every store on db.
func holderLineOf(db *sql.DB, logger *slog.Logger) *holderLine {
	key := weak.Make(db)
	holderLinesMu.Lock()
	defer holderLinesMu.Unlock()
	l := holderLines[key]
	if l == nil {
		l = &holderLine{db: key, logger: logger, turn: make(chan struct{}, 1)}
		holderLines[key] = l
		runtime.AddCleanup(db, func(key weak.Pointer[sql.DB]) {
			holderLinesMu.Lock()
			delete(holderLines, key)
			holderLinesMu.Unlock()
		}, key)
	}
	return l
}

// fills reports whether this claim's connection is to fill the line; it
// then runs on db.Conn's connection and gives it to keep. A claim that
// does not fill it pays an atomic add and a load.
func (l *holderLine) fills() bool {
	l.claims.Add(1)
	if !l.active.Load() && l.active.CompareAndSwap(false, true) {
		l.judge()
		seen := l.claims.Load()
		time.AfterFunc(holderLineIdle, func() { l.idle(seen) })
	}
	return l.want.Load() && l.want.CompareAndSwap(true, false)
}

// judge decides whether the pool, as it is capped when keys are first
// claimed (the application may cap it after NewSQL), wants a line, and
// logs once a limit that fails the store.
func (l *holderLine) judge() {
	db := l.db.Value()
	if db == nil {
		return
	}
	limit := db.Stats().MaxOpenConnections
	switch {
	case limit == 0:
		// database/sql's default. No statement waits for a connection,
		// but a burst of new keys opens one per request, and past the
		// server's limit (100 on PostgreSQL, 151 on MySQL) those it
		// refuses answer 503 while the database is healthy: 387 of 400
		// at once, against none with 16.
		if l.warned.CompareAndSwap(false, true) {
			l.logger.Warn("idempotency: NewSQL: db's pool has no limit (SetMaxOpenConns): a burst of new keys " +
				"opens a connection per request, and those past the server's connection limit are refused 503; " +
				"cap it so that the pools of every instance fit the server's max_connections (a pool beneath " +
				"database/sql that caps its connections, as pgxpool's through stdlib.OpenDBFromPool, does it too)")
		}
	case limit < minLinePool:
		if l.warned.CompareAndSwap(false, true) {
			l.logger.Warn("idempotency: NewSQL: db's pool is too small to keep a connection for the statements "+
				"of running keys: when handlers' transactions take every connection, lease renewals wait "+
				"behind them and may lapse; allow at least 4 (SetMaxOpenConns)", "max_open_connections", limit)
		}
	default:
		l.want.Store(true)
	}
}

// keep takes c, the connection a claim ran on, for the line; err is the
// claim's error, after which c may be broken.
func (l *holderLine) keep(c *sql.Conn, err error) {
	if err != nil && (connectionEnded(err) || broken(c)) {
		c.Close()
		l.want.Store(true)
		return
	}
	l.mu.Lock()
	if l.active.Load() && l.conn == nil {
		l.conn, c = c, nil
	}
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// idle gives the connection back once no claim came for holderLineIdle;
// seen is the claims counted at the last look.
func (l *holderLine) idle(seen int64) {
	if now := l.claims.Load(); now != seen {
		time.AfterFunc(holderLineIdle, func() { l.idle(now) })
		return
	}
	l.turn <- struct{}{} // no operation runs on it meanwhile
	l.mu.Lock()
	c := l.conn
	l.conn = nil
	l.want.Store(false)
	l.active.Store(false)
	l.mu.Unlock()
	<-l.turn
	if c != nil {
		c.Close()
	}
}

// run runs op on the line's connection, after the operation before it;
// on db, the line's database, when the line holds none (not filled yet,
// or broken), as it would have run without a line.
func (l *holderLine) run(ctx context.Context, db *sql.DB, op func(c sqlConn) error) error {
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c == nil {
		<-l.turn
		return op(db)
	}
	err := op(c)
	if err != nil && (connectionEnded(err) || broken(c)) {
		l.mu.Lock()
		l.conn = nil
		l.want.Store(l.active.Load())
		l.mu.Unlock()
		c.Close()
	}
	<-l.turn
	return err
}

// broken reports whether c can no longer run a statement: the server
// closed it, a statement was cut mid-way, or its driver says so.
func broken(c *sql.Conn) bool {
	err := c.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok && !v.IsValid() {
			return driver.ErrBadConn
		}
		return nil
	})
	return err != nil
}

// connectionEnded reports whether err is PostgreSQL saying it ended the
// connection (57P01-57P03: its backend terminated by an administrator, a
// crash, a server stopping or starting), which pgx may not have marked
// closed yet: the statement did not run, or rolled back with the backend,
// and nothing more runs on the connection.
func connectionEnded(err error) bool {
	e, ok := sqldialect.ErrorOf(err)
	return ok && (e.SQLState == "57P01" || e.SQLState == "57P02" || e.SQLState == "57P03")
}

// asHolder runs op, one operation of a run that holds its lease, on db's
// pool, or on the line while every connection of the pool is in use.
func (s *sqlStore) asHolder(ctx context.Context, op func(c sqlConn) error) error {
	if s.line == nil || !poolFull(s.db) {
		return op(s.db)
	}
	return s.line.run(ctx, s.db, op)
}

// poolFull reports whether every connection db may open is in use.
func poolFull(db *sql.DB) bool {
	st := db.Stats()
	return st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections
}

// poolNamed names db's pool in err when err is a statement that ran out of
// time with every connection of the pool in use: what did not answer was
// the pool, not the database.
func poolNamed(db *sql.DB, err error) error {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if st := db.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return &poolFullError{inUse: st.InUse, err: err}
	}
	return err
}

// A poolFullError is a statement that waited for a connection of a full
// pool until it ran out of time.
type poolFullError struct {
	inUse int
	err   error
}

func (e *poolFullError) Error() string {
	return "every connection of db's pool is in use (" + strconv.Itoa(e.inUse) + ", SetMaxOpenConns): " + e.err.Error()
}

func (e *poolFullError) Unwrap() error { return e.err }
