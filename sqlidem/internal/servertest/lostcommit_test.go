package servertest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// A commitTrap loses the reply to one COMMIT: armed, the next Commit
// through its pool returns at once with the error a broken connection
// gives, while the real COMMIT (or, with land false, a ROLLBACK) reaches
// the database delay later, on the connection the pool has given up.
type commitTrap struct {
	armed  atomic.Bool
	delay  time.Duration
	land   bool
	landed chan error // the delayed COMMIT's (or ROLLBACK's) result
}

var errLostReply = fmt.Errorf("read tcp: connection reset by peer: %w", io.ErrUnexpectedEOF)

// trapped returns d with its pool replaced by one of 16 connections whose
// commits trap can lose.
func trapped(t *testing.T, d *sqltest.DB, trap *commitTrap) *sqltest.DB {
	return trappedPool(t, d, trap, 16)
}

// trappedPool is trapped with a pool of limit connections.
func trappedPool(t *testing.T, d *sqltest.DB, trap *commitTrap, limit int) *sqltest.DB {
	trap.landed = make(chan error, 1)
	plain, err := sql.Open(d.Driver, d.DSN)
	must(t, err)
	var connector driver.Connector = dsnConnector{plain.Driver(), d.DSN}
	if dc, ok := plain.Driver().(driver.DriverContext); ok {
		connector, err = dc.OpenConnector(d.DSN)
		must(t, err)
	}
	plain.Close()
	db := sql.OpenDB(trapConnector{connector, trap})
	db.SetMaxOpenConns(limit)
	t.Cleanup(func() { db.Close() })
	c := *d
	c.DB = db
	return &c
}

type dsnConnector struct {
	d   driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

type trapConnector struct {
	driver.Connector
	trap *commitTrap
}

func (c trapConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &trapConn{Conn: conn, trap: c.trap}, nil
}

// trapConn passes everything on to the driver's connection, and gives
// its transactions the trap.
type trapConn struct {
	driver.Conn
	trap   *commitTrap
	broken atomic.Bool
	done   chan struct{} // closed once a trapped transaction ended
}

func (c *trapConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	var tx driver.Tx
	var err error
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = c.Conn.Begin() //nolint:staticcheck // the driver has nothing else
	}
	if err != nil {
		return nil, err
	}
	return &trapTx{Tx: tx, c: c}, nil
}

func (c *trapConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *trapConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := c.Conn.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *trapConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.Conn.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c *trapConn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *trapConn) ResetSession(ctx context.Context) error {
	if c.broken.Load() {
		return driver.ErrBadConn
	}
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *trapConn) IsValid() bool {
	if c.broken.Load() {
		return false
	}
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// Close lets the delayed COMMIT finish on the connection first, as the
// server finishes a transaction whose client has gone.
func (c *trapConn) Close() error {
	if c.broken.Load() {
		go func() {
			<-c.done
			c.Conn.Close()
		}()
		return nil
	}
	return c.Conn.Close()
}

type trapTx struct {
	driver.Tx
	c *trapConn
}

func (tx *trapTx) Commit() error {
	trap := tx.c.trap
	if !trap.armed.CompareAndSwap(true, false) {
		return tx.Tx.Commit()
	}
	tx.c.done = make(chan struct{})
	tx.c.broken.Store(true)
	go func() {
		defer close(tx.c.done)
		time.Sleep(trap.delay)
		// As the statement itself: the driver's Commit may honour the
		// context the transaction began with, which has ended by now,
		// while a COMMIT that reached the server is carried out whatever
		// became of its client.
		end := "ROLLBACK"
		if trap.land {
			end = "COMMIT"
		}
		exec, ok := tx.c.Conn.(driver.ExecerContext)
		if !ok {
			trap.landed <- fmt.Errorf("%T cannot run %s", tx.c.Conn, end)
			return
		}
		_, err := exec.ExecContext(context.Background(), end, nil)
		trap.landed <- err
	}()
	return errLostReply
}

// The reply to the transfer's COMMIT is lost, and the COMMIT lands a
// second later. The transfer committed: its client gets its 201, never
// "not executed", and the key stays the transfer's.
func TestLostCommitReplyThatLandsLater(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		trap := &commitTrap{delay: time.Second, land: true}
		b := newBank(t, trapped(t, d, trap))
		trap.armed.Store(true)
		r := b.post("k1", 12)
		if err := <-trap.landed; err != nil {
			t.Fatalf("the delayed COMMIT: %v", err)
		}
		if r.status != 201 || r.replayed {
			t.Fatalf("a transfer whose COMMIT landed after its reply was lost answered %+v; want its own 201", r)
		}
		if from, to := b.balances(); from != 1000000-12 || to != 12 {
			t.Fatalf("balances %d, %d", from, to)
		}
		if again := b.post("k1", 12); !again.replayed || again.body != r.body || b.runs.Load() != 1 {
			t.Fatalf("retry: %+v after %d runs; want the one answer replayed", again, b.runs.Load())
		}
	})
}

// The reply to the COMMIT is lost and the transaction rolls back: once
// that is certain, the client is told nothing ran, and its retry runs.
func TestLostCommitReplyThatNeverLands(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		trap := &commitTrap{delay: 300 * time.Millisecond, land: false}
		b := newBank(t, trapped(t, d, trap))
		trap.armed.Store(true)
		r := b.post("k1", 12)
		if err := <-trap.landed; err != nil {
			t.Fatalf("the delayed ROLLBACK: %v", err)
		}
		if r.status != 503 || r.problem != "store-unavailable" {
			t.Fatalf("answered %+v; want 503 store-unavailable once the rollback is certain", r)
		}
		if from, to := b.balances(); from != 1000000 || to != 0 {
			t.Fatalf("balances %d, %d", from, to)
		}
		retry := b.post("k1", 12)
		if retry.status != 201 || retry.replayed {
			t.Fatalf("retry: %+v; want it to run", retry)
		}
		if from, to := b.balances(); from != 1000000-12 || to != 12 {
			t.Fatalf("balances %d, %d after the retry", from, to)
		}
	})
}

// The COMMIT lands only after the execution's time is up: the outcome is
// unknown when the run ends, and it says so (409 in-progress, not 503
// "not executed"). The key is kept, and a later retry recovers the
// committed answer.
func TestLostCommitReplyUnsettledKeepsTheKey(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		trap := &commitTrap{delay: 2500 * time.Millisecond, land: true}
		b := newBank(t, trapped(t, d, trap), idempotency.WithExecutionTimeout(time.Second),
			idempotency.WithLockLease(300*time.Millisecond))
		trap.armed.Store(true)
		r := b.post("k1", 12)
		if r.status != 409 || r.problem != "in-progress" {
			t.Fatalf("answered %+v; want 409 in-progress: whether it committed is not known yet", r)
		}
		if st := b.redisState("k1"); st != "run" {
			t.Fatalf("Redis record state %q; want the key kept (run)", st)
		}
		var answers []string
		deadline := time.Now().Add(20 * time.Second)
		for {
			retry := b.post("k1", 12)
			answers = append(answers, fmt.Sprint(retry.status, " ", retry.problem))
			if retry.status == 201 {
				if !retry.replayed || b.runs.Load() != 1 {
					t.Fatalf("retry: %+v after %d runs; want the committed answer recovered", retry, b.runs.Load())
				}
				break
			}
			if retry.status != 409 && retry.status != 503 || time.Now().After(deadline) {
				t.Fatalf("retries answered %s", strings.Join(answers, ", "))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := <-trap.landed; err != nil {
			t.Fatalf("the delayed COMMIT: %v", err)
		}
		if from, to := b.balances(); from != 1000000-12 || to != 12 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// Run under Do: the result whose COMMIT landed late is returned, once.
func TestRunLostCommitReplyThatLandsLater(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		trap := &commitTrap{delay: 500 * time.Millisecond, land: true}
		l := newLedger(t, trapped(t, d, trap))
		trap.armed.Store(true)
		r, err := l.consume("m1", 3)
		if err != nil || r.Charge != 3 {
			t.Fatalf("got %+v, %v; want the charge whose COMMIT landed", r, err)
		}
		if err := <-trap.landed; err != nil {
			t.Fatal(err)
		}
		again, err := l.consume("m1", 3)
		if err != nil || again != r || l.rows() != 1 {
			t.Fatalf("redelivery: %+v, %v; %d ledger rows", again, err, l.rows())
		}
	})
}

// On a pool of one connection, learning what became of a COMMIT whose
// reply was lost takes the pool's one connection: the execution gives its
// own back first. The client learns the outcome as soon as the database
// settled it (its 201, or 503 once the rollback is certain), not when its
// execution's time is up.
func TestLostCommitReplyOnAPoolOfOne(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for _, land := range []bool{true, false} {
			t.Run(map[bool]string{true: "lands", false: "never lands"}[land], func(t *testing.T) {
				trap := &commitTrap{delay: 300 * time.Millisecond, land: land}
				b := newBank(t, trappedPool(t, d, trap, 1), idempotency.WithExecutionTimeout(20*time.Second))
				trap.armed.Store(true)
				began := time.Now()
				r := b.post("k1", 12)
				took := time.Since(began)
				if err := <-trap.landed; err != nil {
					t.Fatalf("the delayed COMMIT or ROLLBACK: %v", err)
				}
				want := map[bool]int{true: 201, false: 503}[land]
				if r.status != want || took > 10*time.Second {
					t.Fatalf("answered %+v after %v; want %d as soon as the database settled it", r, took, want)
				}
			})
		}
	})
}
