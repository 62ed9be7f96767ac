package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// holderLine is one connection of a capped pool that the store keeps for
// the statements of runs that already hold their lease: renewals, the
// store of an answer, a release, a journal entry. Handlers' transactions
// share the pool (sqlidem's must), and when they take every connection,
// a renewal that queued behind them would wait past its lease: every lease
// lapses while the database is healthy, every run is cut, and
// WithRetryAbandoned runs the handlers again. Those statements take the
// line instead, one at a time, and only while the pool has no connection
// free, or while none comes within holderPoolWait; new claims still wait
// for the pool, which is what bounds the work in flight.
//
// Every Middleware of NewSQL on one *sql.DB shares its line. It is filled
// by the next connection that a claim or a running key's statement gets
// from the pool once the line wants one: that connection stays with the
// line, so that the line never waits behind the handlers it serves. A
// pool of minSparePool or more spares it a second connection, which a
// statement takes when the server ended the first one: with every other
// connection held, the next one may come only after the leases lapse.
// While it is in use, the line tends itself every holderLineTend: it pings
// its connection (one the server ended is dropped, and the next one got
// from the pool fills the line again), judges the pool's limit anew (one
// lowered under minLinePool gets its connection back; one raised gets a
// line), trades a connection it has held for holderLineAge for a fresh
// one of the pool's, and gives its connection back to the pool once db is
// closed, or once no key has been claimed or renewed for holderLineIdle
// (or two leases, if longer). A pool without a limit needs no line
// (nothing waits for a connection), and one of fewer than minLinePool
// connections cannot spare it; either is logged once.
type holderLine struct {
	db     weak.Pointer[sql.DB] // live while a store on it is
	logger *slog.Logger

	turn    chan struct{} // held by the one operation on the connection
	lastUse atomic.Int64  // unix nanoseconds of the last claim or running key's statement
	judged  atomic.Int64  // unix nanoseconds of the last judgement of the pool's limit
	idle    atomic.Int64  // how long the line stays unused: the longest of holderLineIdle and two leases
	active  atomic.Bool   // it tends itself: kept, or to be filled, or not needed
	want    atomic.Bool   // the next connection got from the pool fills the line
	warned  atomic.Bool   // a pool without a limit, or too small for a line, was logged
	target  atomic.Int32  // how many connections the pool spares for the line: 0, 1, or 2 (a spare)
	mu      sync.Mutex
	conns   []lineConn // the line's connections, the one in use first
}

// A lineConn is a connection of the line, and when the line took it.
type lineConn struct {
	c     *sql.Conn
	taken time.Time
}

// holderLineIdle is how long a line stays unused; holderLineTend how often
// it tends itself; minLinePool the smallest pool limit that spares a
// connection for it.
const (
	holderLineIdle  = 30 * time.Second
	holderLineTend  = 5 * time.Second
	holderLineJudge = time.Second // a claim that finds no line judges the limit again after this
	minLinePool     = 4
	// minSparePool is the smallest pool limit that spares a second
	// connection: should the server end the line's connection while every
	// other one is held, the renewals go on on the spare, where a new one
	// could not be had before their leases lapse. Under it, with new
	// connections slow to open and the line's ended every 700 ms, leases
	// lapsed under live runs in 4 of 8 runs at a pool of 6, and keys ran
	// twice in 3; with a spare from 6, no key ran twice in 13 runs, at the
	// price of more claims refused 503 while the pool was full.
	minSparePool = 6
	// holderLineAge is how long the line keeps a connection before it
	// trades it for another of the pool's, at a tending while the pool has
	// one free. A connection held for good would escape the pool's own
	// rules (database/sql expires a connection only when it is given
	// back): it would outlive SetConnMaxLifetime, and stay with a server
	// that a failover made a read-only replica, or that a proxy or a load
	// balancer meant to drain.
	holderLineAge = 30 * time.Second
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
		l.idle.Store(int64(holderLineIdle))
		holderLines[key] = l
		runtime.AddCleanup(db, func(key weak.Pointer[sql.DB]) {
			holderLinesMu.Lock()
			delete(holderLines, key)
			holderLinesMu.Unlock()
		}, key)
	}
	return l
}

// claiming notes a claim under a lease of lease. It pays a clock read and
// a few atomic operations.
func (l *holderLine) claiming(lease time.Duration) {
	if idle := max(holderLineIdle, 2*lease); time.Duration(l.idle.Load()) < idle {
		l.idle.Store(int64(idle)) // a running key renews every third of its lease
	}
	now := l.used()
	if !l.want.Load() && now-l.judged.Load() > int64(holderLineJudge) {
		// A limit raised since: judged at once, not at the next tending,
		// so that a burst that follows has its line.
		l.judge()
	}
}

// takes reports whether a connection just got from the pool, by a claim
// or a running key's statement, is to fill the line; its holder then
// gives it to keep rather than back to the pool. It is asked once the
// connection is got, not before the wait for it: with every connection of
// the pool held, the one that comes next is the only one the line can
// have, whoever waited for it.
func (l *holderLine) takes() bool {
	return l.want.Load() && l.want.CompareAndSwap(true, false)
}

// used notes a claim, or a statement of a running key: the line is in
// use, and becomes active if it was not. It returns the time it noted.
func (l *holderLine) used() int64 {
	now := time.Now().UnixNano()
	l.lastUse.Store(now)
	if !l.active.Load() && l.active.CompareAndSwap(false, true) {
		l.judge()
		time.AfterFunc(holderLineTend, l.tend)
	}
	return now
}

// judge decides whether the pool, as it is capped now (the application
// may cap it after NewSQL, or change it), wants a line, gives back the
// line's connection when it does not, and logs once a limit that fails the
// store.
func (l *holderLine) judge() {
	db := l.db.Value()
	if db == nil {
		return
	}
	l.judged.Store(time.Now().UnixNano())
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
				"behind them and may lapse; allow at least 6 (SetMaxOpenConns): 4 keep one, 6 a spare",
				"max_open_connections", limit)
		}
	default:
		target := 1
		if limit >= minSparePool {
			target = 2
		} else if l.warned.CompareAndSwap(false, true) {
			l.logger.Warn("idempotency: NewSQL: db's pool keeps one connection for the statements of running keys "+
				"and no spare: should the server end it while handlers' transactions hold every other one, lease "+
				"renewals wait behind them and may lapse; allow at least 6 (SetMaxOpenConns)",
				"max_open_connections", limit)
		}
		l.target.Store(int32(target))
		l.mu.Lock()
		held := len(l.conns)
		l.want.Store(held < target)
		l.mu.Unlock()
		if held > target { // a pool lowered: the next connection fills the line again
			l.giveBack()
			l.want.Store(true)
		}
		return
	}
	l.target.Store(0)
	l.want.Store(false)
	l.giveBack()
}

// tend is the line's look at itself, every holderLineTend while it is
// active.
func (l *holderLine) tend() {
	db := l.db.Value()
	unused := func() bool { return time.Since(time.Unix(0, l.lastUse.Load())) > time.Duration(l.idle.Load()) }
	if db == nil || unused() || closed(db) {
		l.want.Store(false)
		l.giveBack()
		l.active.Store(false)
		if db != nil && !unused() && !closed(db) {
			l.used() // a key came in between: the line serves it
		}
		return
	}
	l.judge()
	l.ping()
	l.refresh(db)
	time.AfterFunc(holderLineTend, l.tend)
}

// closed reports whether db was closed, without taking a connection.
func closed(db *sql.DB) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := db.Conn(ctx) // a closed db says so before it looks at ctx
	return err != nil && !errors.Is(err, context.Canceled)
}

// ping drops the line's connection when the server ended it while it
// waited (a restart, an idle timeout, a middlebox): found now, the next
// claim fills the line again, rather than a renewal finding it when every
// connection of the pool is held.
func (l *holderLine) ping() {
	select {
	case l.turn <- struct{}{}:
	default:
		return // in use: it answers
	}
	l.mu.Lock()
	conns := slices.Clone(l.conns)
	l.mu.Unlock()
	dropped := false
	for _, lc := range conns {
		ctx, cancel := context.WithTimeout(context.Background(), holderLineTend)
		err := lc.c.PingContext(ctx)
		cancel()
		if err != nil {
			l.drop(lc.c)
			dropped = true
		}
	}
	<-l.turn
	if dropped {
		l.judge() // the next connection got from the pool fills the line again
	}
}

// drop lets the line's connection c go. Called with the turn held; the
// caller then judges the pool (judge may take the turn).
func (l *holderLine) drop(c *sql.Conn) {
	l.mu.Lock()
	l.conns = slices.DeleteFunc(l.conns, func(k lineConn) bool { return k.c == c })
	l.mu.Unlock()
	c.Close()
}

// giveBack returns the line's connections to the pool, after the
// operation on them.
func (l *holderLine) giveBack() {
	l.turn <- struct{}{}
	l.mu.Lock()
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	<-l.turn
	for _, lc := range conns {
		lc.c.Close()
	}
}

// refresh trades each connection the line has held for holderLineAge for
// another of db's pool, taken first, while the pool has one free: the one
// given back then goes by the pool's rules (closed past
// SetConnMaxLifetime, kept idle otherwise). With the pool full it waits,
// since the line is what serves the running keys then, and a connection
// given back would go to a statement waiting for the pool.
func (l *holderLine) refresh(db *sql.DB) {
	l.mu.Lock()
	var aged []*sql.Conn
	for _, lc := range l.conns {
		if time.Since(lc.taken) >= holderLineAge {
			aged = append(aged, lc.c)
		}
	}
	l.mu.Unlock()
	for _, c := range aged {
		if full, _ := poolFull(db); full {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), holderLineTend)
		fresh, err := db.Conn(ctx)
		cancel()
		if err != nil {
			return
		}
		// What goes back to the pool: c once fresh took its place, or
		// fresh when c left the line meanwhile.
		given := fresh
		l.turn <- struct{}{} // after the operation on c, if one runs
		l.mu.Lock()
		if i := slices.IndexFunc(l.conns, func(k lineConn) bool { return k.c == c }); i >= 0 {
			l.conns[i], given = lineConn{fresh, time.Now()}, c
		}
		l.mu.Unlock()
		<-l.turn
		given.Close()
	}
}

// keep takes c, the connection a claim or a running key's statement ran
// on, for the line; err is that statement's error, after which c may be
// broken.
func (l *holderLine) keep(c *sql.Conn, err error) {
	if gone(c, err) {
		c.Close()
		l.judge() // the next connection fills the line again, if the pool still spares one
		return
	}
	l.mu.Lock()
	if l.active.Load() && len(l.conns) < int(l.target.Load()) {
		l.conns, c = append(l.conns, lineConn{c, time.Now()}), nil
		l.want.Store(len(l.conns) < int(l.target.Load()))
	}
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// run runs op on the line's connection, after the operation before it;
// on its spare when the server ended that connection (each operation is
// safe to repeat: keyStore); on a connection of db's pool while the line
// holds none (not filled yet, or ended by the server), unless a claim or
// another statement fills the line first (poolOrLine).
func (l *holderLine) run(ctx context.Context, db *sql.DB, op func(c sqlConn) error) error {
	for attempt := 1; ; attempt++ {
		select {
		case l.turn <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		c := l.first()
		if c == nil {
			<-l.turn
			pooled, err := l.poolOrLine(ctx, db)
			switch {
			case err != nil:
				return err
			case pooled == nil:
				continue // the line holds a connection again
			}
			if done, err := l.runOn(ctx, pooled, op, attempt); done {
				return err
			}
			continue
		}
		err := op(c)
		if !gone(c, err) || ctx.Err() != nil {
			<-l.turn
			return err
		}
		l.drop(c)
		<-l.turn
		l.judge() // the next connection got from the pool fills the line again
	}
}

// first is the line's connection in use, nil when it holds none.
func (l *holderLine) first() *sql.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) == 0 {
		return nil
	}
	return l.conns[0].c
}

// poolOrLine waits, while the line holds no connection, for one of db's
// pool, looking at the line every holderLineLook: it returns nil once the
// line holds one again, so that a statement waiting behind the handlers'
// transactions moves to the line as soon as a claim or another statement
// has filled it. The pool's connection, should it come after that, goes
// to the line if the line wants one, or back to the pool.
func (l *holderLine) poolOrLine(ctx context.Context, db *sql.DB) (*sql.Conn, error) {
	wait, stop := context.WithCancel(ctx)
	type pooled struct {
		c   *sql.Conn
		err error
	}
	got := make(chan pooled, 1)
	go func() {
		c, err := db.Conn(wait)
		got <- pooled{c, err}
	}()
	look := time.NewTicker(holderLineLook)
	defer look.Stop()
	for {
		select {
		case p := <-got:
			stop()
			return p.c, p.err
		case <-look.C:
			if l.first() == nil {
				continue
			}
			stop()
			go func() {
				if p := <-got; p.c != nil {
					l.keepOrGiveBack(p.c, nil)
				}
			}()
			return nil, nil
		}
	}
}

// holderLineLook is how often a running key's statement that waits for
// the pool, the line having no connection, looks at the line again.
const holderLineLook = 50 * time.Millisecond

// asHolder runs op, one operation of a run that holds its lease, on a
// connection of db's pool, or on the line while every connection of the
// pool is in use, or when none comes within holderPoolWait; an error that
// ran out of time waiting for the pool names it (poolNamed).
func (s *sqlStore) asHolder(ctx context.Context, op func(c sqlConn) error) error {
	if s.line == nil {
		return poolNamed(s.db, op(s.db))
	}
	s.line.used()
	if full, _ := poolFull(s.db); !full {
		if done, err := s.line.onPool(ctx, s.db, holderPoolWait(s.cfg.lease), op); done {
			return poolNamed(s.db, err)
		}
	}
	return poolNamed(s.db, s.line.run(ctx, s.db, op))
}

// holderPoolWait is how long a running key's statement waits for a
// connection of a pool that was not full when it looked: an eighth of its
// lease, which leaves the line most of the time a renewal has. The pool
// can fill between the look and the wait (a handler's transaction takes
// the last connection, and holds it for as long as it runs), and a new
// connection can be slow to open (a server busy starting backends, or
// refusing them at its connection limit): waiting for either, a renewal
// outlasted its lease, and another instance took the key over from a live
// run.
func holderPoolWait(lease time.Duration) time.Duration { return lease / 8 }

// onPool runs op, a running key's statement, on a connection of db's pool
// that comes within wait, moving past ones the server ended as a claim
// does (runOn). done is false when no connection came in time or none
// could be opened, and op is to run on the line (it ran at most on
// connections the server had ended: each operation is safe to repeat).
func (l *holderLine) onPool(ctx context.Context, db *sql.DB, wait time.Duration, op func(c sqlConn) error) (done bool, err error) {
	for attempt := 1; ; attempt++ {
		c, err := connWithin(ctx, db, wait)
		if err != nil {
			// A closed db ends here, as on db itself: the line's
			// connection outlives it only until the line gives it back.
			return ctx.Err() != nil || closed(db), err
		}
		if done, err := l.runOn(ctx, c, op, attempt); done {
			return true, err
		}
	}
}

// runOn runs op on c, a connection of db's pool, which then goes to the
// line if the line wants one, or back to the pool. done is false when the
// server had ended c, so that op did not run, and may run on another: at
// most maxDeadConnAttempts times, as a claim.
func (l *holderLine) runOn(ctx context.Context, c *sql.Conn, op func(c sqlConn) error, attempt int) (done bool, err error) {
	err = op(c)
	dead := err != nil && (errors.Is(err, driver.ErrBadConn) || connectionEnded(err))
	l.keepOrGiveBack(c, err)
	return !dead || ctx.Err() != nil || attempt >= maxDeadConnAttempts, err
}

// keepOrGiveBack gives c, a connection of the pool that a statement ran on
// (err its error), to the line if the line wants one, or back to the pool.
func (l *holderLine) keepOrGiveBack(c *sql.Conn, err error) {
	if l.takes() {
		l.keep(c, err)
	} else {
		c.Close()
	}
}

// connWithin is a connection of db's pool that comes within wait.
func connWithin(ctx context.Context, db *sql.DB, wait time.Duration) (*sql.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return db.Conn(ctx)
}
