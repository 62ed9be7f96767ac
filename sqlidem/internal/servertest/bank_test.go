package servertest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// bank is a transfer endpoint on a SQL database, protected by the
// middleware with the outcome store: a second execution of a transfer
// would show as a wrong balance.
type bank struct {
	t         *testing.T
	db        *sqltest.DB
	store     *sqlidem.Store
	rdb       redis.UniversalClient
	accounts  string
	srv       *httptest.Server
	outcomes  string       // the outcome table
	entered   atomic.Int64 // protected requests that reached the handler
	recovered atomic.Int64 // calls of the store's Recover
	runs      atomic.Int64 // transfers that ran fn
	// before, when set, runs before the transaction (an executor paused
	// after its claim); inside, inside it, after fn's writes.
	before func(ctx context.Context, e idempotency.Execution)
	inside func(idempotency.Execution)
	// first, when set, runs in the transaction before any write.
	first func(ctx context.Context)
	// beforeDebit, when set, runs in the transaction after the outcome
	// row's read and before any write; afterDebit between the debit of
	// account 1 and the credit of account 2. An error ends the transfer.
	beforeDebit, afterDebit func(ctx context.Context, tx *sql.Tx) error
	calls                   atomic.Int64 // transfers begun, every attempt counted
	// header, when set, is added to every transfer's answer.
	header http.Header
	// failAfter, when set, is what the transfer returns after it wrote
	// its whole answer.
	failAfter error
	// pad adds that many bytes to every answer's body.
	pad int

	mu    sync.Mutex
	execs map[string]idempotency.Execution // by Idempotency-Key
}

func newBank(t *testing.T, d *sqltest.DB, opts ...idempotency.Option) *bank {
	t.Helper()
	return newBankWith(t, d, nil, opts...)
}

// newBankWith is newBank with options for its Store.
func newBankWith(t *testing.T, d *sqltest.DB, storeOpts []sqlidem.Option, opts ...idempotency.Option) *bank {
	t.Helper()
	b := &bank{t: t, db: d, execs: map[string]idempotency.Execution{}}
	b.outcomes = d.Table(t, "outcomes")
	store, err := sqlidem.New(d.DB, d.Dialect, append([]sqlidem.Option{sqlidem.WithTable(b.outcomes)}, storeOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ddl := store.DDL()
	if d.Kind == sqltest.MySQL {
		// The character set MariaDB before 11.6 and MySQL 5.7 default
		// to, which refuses most of U+0080 to U+009F: the header column
		// must hold whatever bytes a header has all the same.
		ddl += " DEFAULT CHARSET=latin1"
	}
	must(t, exec(d.DB, ddl))
	b.store = store
	b.accounts = d.Table(t, "accounts")
	must(t, exec(d.DB, "CREATE TABLE "+b.accounts+" (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)"))
	must(t, exec(d.DB, "INSERT INTO "+b.accounts+" (id, balance) VALUES (1, 1000000), (2, 0)"))

	prefix := "sqlidem-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	b.rdb = redistest.Client(t, prefix)
	m := idempotency.New(b.rdb, append([]idempotency.Option{
		idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(), idempotency.WithOutcomeStore(countingRecover{store, &b.recovered}),
		idempotency.WithLockLease(2 * time.Second),
		// Every request goes to Redis, as on a second instance: this one's
		// cache would replay what the tests make Redis forget.
		idempotency.WithResponseCache(0, 0),
	}, opts...)...)
	paused := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e, ok := idempotency.ExecutionOf(r.Context()); ok {
			b.entered.Add(1)
			b.mu.Lock()
			b.execs[r.Header.Get("Idempotency-Key")] = e
			b.mu.Unlock()
			if b.before != nil {
				b.before(r.Context(), e)
			}
		}
		store.Handler(b.transfer).ServeHTTP(w, r)
	})
	b.srv = httptest.NewServer(m.ProtectKey(paused))
	t.Cleanup(b.srv.Close)
	return b
}

// transfer moves amount from account 1 to account 2.
func (b *bank) transfer(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
	var in struct{ Amount int64 }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return errors.New("bad amount")
	}
	ctx := r.Context()
	b.calls.Add(1)
	if b.first != nil {
		b.first(ctx)
	}
	q := b.db.Dialect.Bind("UPDATE " + b.accounts + " SET balance = balance + ? WHERE id = ?")
	if b.beforeDebit != nil {
		if err := b.beforeDebit(ctx, tx); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, q, -in.Amount, 1); err != nil {
		return err
	}
	if b.afterDebit != nil {
		if err := b.afterDebit(ctx, tx); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, q, in.Amount, 2); err != nil {
		return err
	}
	if b.inside != nil {
		e, _ := idempotency.ExecutionOf(ctx)
		b.inside(e)
	}
	n := b.runs.Add(1)
	for name, values := range b.header {
		w.Header()[name] = values
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	if b.pad > 0 {
		fmt.Fprintf(w, `{"transfer":%d,"amount":%d,"pad":"%s"}`, n, in.Amount, strings.Repeat("x", b.pad))
		return b.failAfter
	}
	fmt.Fprintf(w, `{"transfer":%d,"amount":%d}`, n, in.Amount)
	return b.failAfter
}

type reply struct {
	status   int
	body     string
	replayed bool
	header   http.Header
	problem  string
}

func (b *bank) post(key string, amount int64) reply {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.srv.URL+"/transfers", strings.NewReader(fmt.Sprintf(`{"amount":%d}`, amount)))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	return replyOf(res)
}

// replyOf reads res, and closes its body.
func replyOf(res *http.Response) reply {
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	rp := reply{status: res.StatusCode, body: string(body), header: res.Header,
		replayed: res.Header.Get(idempotency.ReplayedHeader) == "true"}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		var p struct{ Type string }
		json.Unmarshal(body, &p)
		rp.problem = strings.TrimPrefix(p.Type, idempotency.ProblemTypeBase)
	}
	return rp
}

// balances returns accounts 1 and 2.
func (b *bank) balances() (int64, int64) {
	b.t.Helper()
	var from, to int64
	must(b.t, b.db.QueryRow("SELECT balance FROM "+b.accounts+" WHERE id = 1").Scan(&from))
	must(b.t, b.db.QueryRow("SELECT balance FROM "+b.accounts+" WHERE id = 2").Scan(&to))
	return from, to
}

func (b *bank) execution(key string) idempotency.Execution {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.execs[key]
	if !ok {
		b.t.Fatalf("no execution seen for key %q", key)
	}
	return e
}

// abandon makes the key's Redis record read as an execution whose
// instance stopped before it stored an answer: claimed by a lock value
// nobody holds, with no answer.
func (b *bank) abandon(key string) {
	b.t.Helper()
	rec := b.record(key)
	ctx := b.t.Context()
	must(b.t, redistest.Abandon(ctx, b.rdb, rec))
}

// record names the key's Redis record, which is its Execution.Key.
func (b *bank) record(key string) string { return b.execution(key).Key }

// loseLease deletes the lock of the run on ctx, whose record is record,
// and returns once the middleware has cancelled the run for it: as a
// paused executor wakes to find its lease gone and its context ended.
func (b *bank) loseLease(ctx context.Context, record string) {
	lock := strings.TrimSuffix(record, "r") + "l"
	if err := b.rdb.Del(context.Background(), lock).Err(); err != nil {
		b.t.Error(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		b.t.Error("the run's context outlived its lease by 10 s")
	}
}

func (b *bank) redisState(key string) string {
	return redistest.RecordState(b.t.Context(), b.rdb, b.record(key))
}

func exec(db *sql.DB, query string) error {
	_, err := db.Exec(query)
	return err
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// countingRecover counts the middleware's calls of Recover.
type countingRecover struct {
	*sqlidem.Store
	calls *atomic.Int64
}

func (c countingRecover) Recover(ctx context.Context, key string, fence uint64) (idempotency.Answer, bool, error) {
	c.calls.Add(1)
	return c.Store.Recover(ctx, key, fence)
}
