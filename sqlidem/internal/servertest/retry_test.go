package servertest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// deferred returns d with its pool replaced, on SQLite, by one whose
// transactions begin DEFERRED: they read first and take the write lock at
// their first write, which fails (SQLITE_BUSY_SNAPSHOT) when another
// connection committed since their first read. That is how a SQLite
// transaction gets aborted. Other databases are returned as they are.
func deferred(t *testing.T, d *sqltest.DB) *sqltest.DB {
	if d.Kind != sqltest.SQLite {
		return d
	}
	db, err := sql.Open(d.Driver, strings.Replace(d.DSN, "_txlock=immediate", "_txlock=deferred", 1))
	must(t, err)
	t.Cleanup(func() { db.Close() })
	c := *d
	c.DB = db
	return &c
}

// abortable opens a second pool on d and readies it for abort.
func abortable(t *testing.T, d *sqltest.DB) *sql.DB {
	base := mustOpen(t, d.Driver, d.DSN)
	if d.Kind == sqltest.SQLite {
		_, err := base.Exec("CREATE TABLE IF NOT EXISTS abort_scratch (n INTEGER)")
		must(t, err)
	}
	return base
}

// abortsOnce is a transaction hook that makes the database abort the first
// transaction it sees (see abort), and lets every later one through.
func abortsOnce(t *testing.T, d *sqltest.DB) func(context.Context, *sql.Tx) error {
	base := abortable(t, d)
	var once sync.Once
	return func(ctx context.Context, tx *sql.Tx) (err error) {
		once.Do(func() { err = abort(ctx, d, base, tx) })
		return err
	}
}

// abort makes the database abort tx, which has read already, as a
// serialization failure or a deadlock does: PostgreSQL and MySQL raise
// the very SQLSTATE and error number, and on SQLite (a deferred pool)
// another connection commits, so that tx's first write meets a stale
// snapshot. base is a pool other than tx's, from abortable.
func abort(ctx context.Context, d *sqltest.DB, base *sql.DB, tx *sql.Tx) error {
	var err error
	switch d.Kind {
	case sqltest.PostgreSQL:
		_, err = tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access'; END $$`)
	case sqltest.MySQL:
		_, err = tx.ExecContext(ctx, `SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'Deadlock found when trying to get lock'`)
	default:
		var n int // the transaction's snapshot begins with its first read
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM abort_scratch").Scan(&n); err != nil {
			return err
		}
		if _, err := base.ExecContext(ctx, "INSERT INTO abort_scratch (n) VALUES (1)"); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO abort_scratch (n) VALUES (2)")
	}
	if err == nil {
		return errors.New("the database did not abort the transaction")
	}
	return fmt.Errorf("transfer: %w", err) // wrapped, as handlers do
}

// A transaction the database aborts inside the handler committed nothing:
// it runs again, and the client gets the one transfer's 201, never a 500.
func TestAbortedTransactionIsRunAgain(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		d = deferred(t, d)
		b := newBank(t, d)
		b.beforeDebit = abortsOnce(t, d)
		r := b.post("k1", 5)
		if r.status != 201 || r.replayed {
			t.Fatalf("answered %+v; want the transfer's 201 after one more attempt", r)
		}
		if n := b.calls.Load(); n != 2 {
			t.Fatalf("the transfer began %d times; want 2", n)
		}
		if from, to := b.balances(); from != 1000000-5 || to != 5 {
			t.Fatalf("balances %d, %d", from, to)
		}
		if again := b.post("k1", 5); !again.replayed || again.body != r.body {
			t.Fatalf("duplicate: %+v", again)
		}
	})
}

// A transaction aborted at every attempt is answered 503 with
// Retry-After, its key released, once the attempts run out (WithAttempts)
// or the execution ends: the client's retry runs.
func TestAbortedEveryTimeAnswersUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store []sqlidem.Option
		opts  []idempotency.Option
		until func(calls int64) bool // what the count of runs must satisfy
	}{
		{"attempts run out", []sqlidem.Option{sqlidem.WithAttempts(3)}, nil, func(n int64) bool { return n == 3 }},
		{"execution ends", nil, []idempotency.Option{idempotency.WithExecutionTimeout(time.Second)}, func(n int64) bool { return n > 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
				d = deferred(t, d)
				b := newBankWith(t, d, tc.store, tc.opts...)
				base := abortable(t, d)
				b.beforeDebit = func(ctx context.Context, tx *sql.Tx) error { return abort(ctx, d, base, tx) }
				r := b.post("k1", 5)
				if r.status != 503 || r.problem != "store-unavailable" || r.header.Get("Retry-After") == "" {
					t.Fatalf("answered %+v; want 503 store-unavailable with Retry-After", r)
				}
				if n := b.calls.Load(); !tc.until(n) {
					t.Fatalf("the transfer began %d times", n)
				}
				if from, to := b.balances(); from != 1000000 || to != 0 {
					t.Fatalf("balances %d, %d", from, to)
				}
				b.beforeDebit = nil
				if retry := b.post("k1", 5); retry.status != 201 || retry.replayed {
					t.Fatalf("retry: %+v; want it to run, the key released", retry)
				}
			})
		})
	}
}

// A real deadlock between the handler's transaction and another one: the
// database picks the handler's as its victim, and the handler's runs
// again once the other committed.
func TestDeadlockInTheHandlerIsRunAgain(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.SQLite {
			t.Skip("SQLite has one writer at a time, and a transaction that takes the write lock at BEGIN " +
				"(as sqlidem's documentation asks) never deadlocks; its aborts are stale snapshots, " +
				"covered by TestAbortedTransactionIsRunAgain")
		}
		b := newBank(t, d)
		holds, waits := make(chan struct{}), make(chan struct{})
		var once sync.Once
		b.afterDebit = func(ctx context.Context, tx *sql.Tx) error {
			once.Do(func() {
				close(holds) // account 1 is the handler's
				<-waits      // the other transaction holds 2 and waits for 1
			})
			return nil // and on to account 2: a deadlock
		}
		other := make(chan error, 1)
		go func() { other <- b.lockInReverse(holds, waits) }()
		r := b.post("k1", 5)
		if err := <-other; err != nil {
			t.Fatalf("the other transaction: %v", err)
		}
		if r.status != 201 || r.replayed {
			t.Fatalf("answered %+v; want the transfer's 201, run again after the deadlock", r)
		}
		if n := b.calls.Load(); n != 2 {
			t.Fatalf("the transfer began %d times; want 2", n)
		}
		if from, to := b.balances(); from != 1000000-5 || to != 5 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// lockInReverse locks account 2, then waits for account 1, which the
// handler holds, and commits once it has it. It makes sure the handler's
// transaction is the deadlock's victim: on PostgreSQL it waits first and
// checks for deadlocks last (deadlock_timeout), on MySQL it is the larger
// transaction, which InnoDB spares.
func (b *bank) lockInReverse(holds <-chan struct{}, waits chan<- struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	<-holds
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var id int64
	switch b.db.Kind {
	case sqltest.PostgreSQL:
		if _, err := tx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '20s'"); err != nil {
			return err
		}
		err = tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&id)
	case sqltest.MySQL:
		scratch := b.db.Table(b.t, "weight")
		if _, err := b.db.ExecContext(ctx, "CREATE TABLE "+scratch+" (n INTEGER)"); err != nil {
			return err
		}
		for i := range 50 {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+scratch+" (n) VALUES (?)", i); err != nil {
				return err
			}
		}
		err = tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id)
	}
	if err != nil {
		return err
	}
	touch := b.db.Dialect.Bind("UPDATE " + b.accounts + " SET balance = balance WHERE id = ?")
	if _, err := tx.ExecContext(ctx, touch, 2); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		_, err := tx.ExecContext(ctx, touch, 1)
		if err == nil {
			err = tx.Commit()
		}
		done <- err
	}()
	waiting := "SELECT COUNT(*) FROM pg_locks WHERE pid = $1 AND NOT granted"
	if b.db.Kind == sqltest.MySQL {
		waiting = "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'"
	}
	for {
		var n int
		if err := b.db.QueryRowContext(ctx, waiting, id).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			break
		}
		select {
		case err := <-done:
			return fmt.Errorf("the other transaction never waited (%v)", err)
		case <-time.After(lockPoll(b.db.Kind)):
		}
	}
	close(waits)
	return <-done
}

// Run under Do runs its function again too.
func TestRunRunsAnAbortedTransactionAgain(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		d = deferred(t, d)
		l := newLedger(t, d)
		l.hook = abortsOnce(t, d)
		var o idempotency.Outcome
		r, err := l.consume("m1", 9, idempotency.ReportOutcome(&o))
		if err != nil || r.Charge != 9 || o != idempotency.Executed {
			t.Fatalf("got %+v, %v (%v); want the charge, run again", r, err, o)
		}
		if l.rows() != 1 || l.calls.Load() != 2 {
			t.Fatalf("%d ledger rows after %d attempts", l.rows(), l.calls.Load())
		}
	})
}

// WithIsolation runs the transactions at the level it names. At
// PostgreSQL's SERIALIZABLE, a transfer whose account another transaction
// changed after its snapshot is aborted (40001) and run again.
func TestWithIsolation(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBankWith(t, d, []sqlidem.Option{sqlidem.WithIsolation(sql.LevelSerializable)})
		if d.Kind == sqltest.PostgreSQL {
			var once sync.Once
			b.beforeDebit = func(ctx context.Context, tx *sql.Tx) (err error) {
				once.Do(func() {
					var balance int64 // the transaction's snapshot begins with its first read
					if err = tx.QueryRowContext(ctx, "SELECT balance FROM "+b.accounts+" WHERE id = 1").Scan(&balance); err != nil {
						return
					}
					_, err = d.ExecContext(ctx, "UPDATE "+b.accounts+" SET balance = balance WHERE id = 1")
				})
				return err
			}
		}
		r := b.post("k1", 4)
		if r.status != 201 {
			t.Fatalf("answered %+v", r)
		}
		want := int64(1)
		if d.Kind == sqltest.PostgreSQL {
			want = 2
		}
		if n := b.calls.Load(); n != want {
			t.Fatalf("the transfer began %d times; want %d", n, want)
		}
		if from, to := b.balances(); from != 1000000-4 || to != 4 {
			t.Fatalf("balances %d, %d", from, to)
		}
	})
}

// The protocol holds at every isolation level the databases offer: one
// commit per key, replays, and a stale executor paused inside its
// transaction fenced out by recovery, its writes rolled back.
func TestEveryIsolationLevel(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		levels := []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}
		if d.Kind == sqltest.SQLite {
			levels = []sql.IsolationLevel{sql.LevelDefault} // serializable; the driver takes no other
		}
		for _, level := range levels {
			t.Run(level.String(), func(t *testing.T) {
				b := newBankWith(t, d, []sqlidem.Option{sqlidem.WithIsolation(level)})
				first := b.post("k1", 3)
				if again := b.post("k1", 3); first.status != 201 || !again.replayed || again.body != first.body {
					t.Fatalf("first %+v, duplicate %+v", first, again)
				}
				must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
				if again := b.post("k1", 3); !again.replayed || again.body != first.body {
					t.Fatalf("after Redis forgot: %+v", again)
				}
				// On SQLite the open transaction holds the database's
				// write lock, and recovery's fence waits for it to end
				// (see docs/outcomes.md). Elsewhere the executor's
				// transaction has not touched its key's row yet (it is
				// read before BEGIN), at every level.
				waits := d.Kind == sqltest.SQLite
				// Paused inside its transaction while recovery fences the
				// key for a newer execution.
				b.inside = func(e idempotency.Execution) {
					timeout := 10 * time.Second
					if waits {
						timeout = 300 * time.Millisecond
					}
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					_, committed, err := b.store.Recover(ctx, e.Key, e.Fence+1)
					switch {
					case waits && (err == nil || ctx.Err() == nil):
						t.Errorf("Recover beside an open transaction: %v; want it to wait", err)
					case !waits && (err != nil || committed):
						t.Errorf("Recover: committed %v, %v", committed, err)
					}
				}
				r := b.post("k2", 4)
				b.inside = nil
				switch {
				case waits && r.status != 201:
					t.Fatalf("the executor that recovery waited for answered %+v; want its 201", r)
				case !waits && (r.status != 409 || r.problem != "in-progress"):
					t.Fatalf("stale executor answered %+v; want 409 in-progress", r)
				}
				wantFrom, wantTo := int64(1000000-3), int64(3)
				if waits {
					wantFrom, wantTo = wantFrom-4, wantTo+4
				}
				if from, to := b.balances(); from != wantFrom || to != wantTo {
					t.Fatalf("balances %d, %d after %d runs", from, to, b.runs.Load())
				}
			})
		}
	})
}

func mustOpen(t *testing.T, driver, dsn string) *sql.DB {
	db, err := sql.Open(driver, dsn)
	must(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}
