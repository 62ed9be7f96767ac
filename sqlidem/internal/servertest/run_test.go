package servertest_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

type receipt struct {
	Charge int64  `json:"charge"`
	Run    int64  `json:"run"`
	Note   string `json:"note,omitempty"`
}

// ledger is a queue consumer that charges once per message through Do and
// Run: a second execution would show as a second ledger row.
type ledger struct {
	t      *testing.T
	d      *sqltest.DB
	store  *sqlidem.Store
	m      *idempotency.Middleware
	table  string
	runs   atomic.Int64
	record string // the last execution's Redis record
	fail   error  // when set, the charge fails after its write
	note   string // when set, the receipt's note
	// hook, when set, runs in the transaction before the charge's write;
	// an error ends the charge.
	hook  func(ctx context.Context, tx *sql.Tx) error
	calls atomic.Int64 // charges begun, every attempt counted
}

func newLedger(t *testing.T, d *sqltest.DB, opts ...idempotency.Option) *ledger {
	l := &ledger{t: t, d: d, table: d.Table(t, "ledger")}
	store, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(d.Table(t, "outcomes")))
	must(t, err)
	must(t, store.CreateTable(t.Context()))
	must(t, exec(d.DB, "CREATE TABLE "+l.table+" (msg VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)"))
	prefix := "sqlidem-run-" + string(d.Kind)
	rdb := redistest.Client(t, prefix)
	l.store = store
	l.m = idempotency.New(rdb, append([]idempotency.Option{idempotency.WithKeyPrefix(prefix), idempotency.WithOutcomeStore(store),
		idempotency.WithResponseCache(0, 0), idempotency.WithLockLease(2 * time.Second)}, opts...)...)
	return l
}

func (l *ledger) consume(msg string, amount int64, opts ...idempotency.DoOption) (receipt, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := idempotency.Key{Scope: "payments-queue", ID: msg, Input: []byte(msg)}
	return idempotency.Do(ctx, l.m, key, func(ctx context.Context) (receipt, error) {
		e, _ := idempotency.ExecutionOf(ctx)
		l.record = e.Key
		return sqlidem.Run(ctx, l.store, func(ctx context.Context, tx *sql.Tx) (receipt, error) {
			l.calls.Add(1)
			if l.hook != nil {
				if err := l.hook(ctx, tx); err != nil {
					return receipt{}, err
				}
			}
			if _, err := tx.ExecContext(ctx, l.d.Dialect.Bind("INSERT INTO "+l.table+" (msg, amount) VALUES (?, ?)"), msg, amount); err != nil {
				return receipt{}, err
			}
			if l.fail != nil {
				return receipt{}, l.fail
			}
			return receipt{Charge: amount, Run: l.runs.Add(1), Note: l.note}, nil
		})
	}, opts...)
}

// rdb is a client of the ledger's Redis.
func (l *ledger) rdb(t *testing.T) redis.UniversalClient {
	return redistest.Client(t, "sqlidem-run-"+string(l.d.Kind))
}

func (l *ledger) rows() int {
	var n int
	must(l.t, l.d.QueryRow("SELECT COUNT(*) FROM "+l.table).Scan(&n))
	return n
}

func TestRunCommitsOnceThroughDo(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d)
		first, err := l.consume("m1", 30)
		must(t, err)
		again, err := l.consume("m1", 30)
		must(t, err)
		if again != first || l.runs.Load() != 1 || l.rows() != 1 {
			t.Fatalf("redelivery got %+v (first %+v); runs %d, ledger rows %d", again, first, l.runs.Load(), l.rows())
		}

		// Redis forgets: Run finds the committed result and does not charge.
		rdb := redistest.Client(t, "sqlidem-run-"+string(d.Kind))
		must(t, rdb.Del(t.Context(), l.record).Err())
		afterLoss, err := l.consume("m1", 30)
		must(t, err)
		if afterLoss != first || l.runs.Load() != 1 || l.rows() != 1 {
			t.Fatalf("after Redis forgot: %+v; runs %d, rows %d", afterLoss, l.runs.Load(), l.rows())
		}

		// Abandoned after the commit: recovery returns the committed result.
		must(t, redistest.Abandon(t.Context(), rdb, l.record))
		var o idempotency.Outcome
		recovered, err := l.consume("m1", 30, idempotency.ReportOutcome(&o))
		must(t, err)
		if recovered != first || o != idempotency.Replayed || l.rows() != 1 {
			t.Fatalf("recovered %+v (%v); rows %d", recovered, o, l.rows())
		}
	})
}

func TestRunFailureCommitsNothingAndReleases(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d)
		l.fail = errors.New("card declined")
		// Even with StoreErrors the key is released: nothing committed.
		if _, err := l.consume("m1", 5, idempotency.StoreErrors()); !errors.Is(err, l.fail) {
			t.Fatalf("err %v", err)
		}
		if l.rows() != 0 {
			t.Fatalf("%d ledger rows after a failed charge", l.rows())
		}
		l.fail = nil
		r, err := l.consume("m1", 5)
		if err != nil || r.Charge != 5 || l.rows() != 1 {
			t.Fatalf("retry: %+v, %v; rows %d", r, err, l.rows())
		}
	})
}

// Run commits one row per Do call: a second Run in the same function
// would be handed the first one's result. It is refused instead, and its
// function does not run.
func TestRunTwiceInOneDo(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		store, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(d.Table(t, "outcomes")))
		must(t, err)
		must(t, store.CreateTable(t.Context()))
		prefix := "sqlidem-twice-" + string(d.Kind)
		m := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithOutcomeStore(store))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		secondRan := false
		_, err = idempotency.Do(ctx, m, idempotency.Key{ID: "twice"}, func(ctx context.Context) (string, error) {
			a, err := sqlidem.Run(ctx, store, func(ctx context.Context, tx *sql.Tx) (string, error) { return "debited", nil })
			if err != nil {
				return "", err
			}
			b, err := sqlidem.Run(ctx, store, func(ctx context.Context, tx *sql.Tx) (int, error) {
				secondRan = true
				return 7, nil
			})
			if err != nil {
				return "", err
			}
			return a + " " + string(rune('0'+b)), nil
		})
		if !errors.Is(err, sqlidem.ErrAlreadyCommitted) || secondRan {
			t.Fatalf("a second Run in one Do call: %v (its function ran: %v); want ErrAlreadyCommitted", err, secondRan)
		}
	})
}

// A result that JSON would give back altered (a note that is not UTF-8)
// commits as executed and not replayable: a redelivery gets
// ErrNotReplayable, also once Redis forgot, never an altered receipt.
func TestRunResultThatWouldComeBackAltered(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		l := newLedger(t, d)
		l.note = "caf\xe9"
		r, err := l.consume("m1", 4)
		if !errors.Is(err, idempotency.ErrNotReplayable) || r.Note != l.note {
			t.Fatalf("first: %+v, %v; want the receipt with ErrNotReplayable", r, err)
		}
		if _, err := l.consume("m1", 4); !errors.Is(err, idempotency.ErrNotReplayable) {
			t.Fatalf("redelivery: %v", err)
		}
		must(t, l.rdb(t).Del(t.Context(), l.record).Err())
		if r, err := l.consume("m1", 4); !errors.Is(err, idempotency.ErrNotReplayable) {
			t.Fatalf("redelivery after Redis forgot: %+v, %v", r, err)
		}
		if l.rows() != 1 || l.runs.Load() != 1 {
			t.Fatalf("%d ledger rows, %d runs", l.rows(), l.runs.Load())
		}
	})
}

// A Do call that takes over an abandoned execution which committed
// nothing logs that it runs the function again: a queue consumer's log
// speaks of its function, not of a handler.
func TestRunAgainAfterAbandonLogsTheFunction(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		var logs syncbuf.Buffer
		l := newLedger(t, d, idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		_, err := l.consume("m1", 30)
		must(t, err)
		// Nothing committed, and the instance that claimed it is gone.
		_, err = l.store.Purge(t.Context(), time.Now().Add(time.Hour))
		must(t, err)
		must(t, redistest.Abandon(t.Context(), l.rdb(t), l.record))
		_, err = l.consume("m1", 30)
		must(t, err)
		if !strings.Contains(logs.String(), "committed nothing; running the function again") {
			t.Fatalf("log:\n%s\nwant the recovery to say the function runs again", logs.String())
		}
	})
}
