package sqlstoretest

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/onceonly/idempotency/pgnotify"
	"github.com/onceonly/idempotency/storetest"
)

// The conformance kit on PostgreSQL with waiters woken by LISTEN/NOTIFY.
func TestStoreConformancePostgresNotified(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	storetest.Run(t, func(t *testing.T) storetest.Keyspace {
		table := d.Table(t, "idem_keys")
		return func(opts ...idempotency.Option) *idempotency.Middleware {
			return idempotency.NewSQL(d.DB, d.Dialect, append([]idempotency.Option{idempotency.WithSQLTable(table),
				idempotency.WithSQLListener(pgnotify.Listener(d.DB))}, opts...)...)
		}
	})
}

// A duplicate waiting on one instance is notified when the holder on
// another stores its answer, and keys that nobody waits for notify nobody.
func TestWaitingDuplicateIsNotified(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	table := d.Table(t, "idem_notify")
	heard := &recordingListener{SQLListener: pgnotify.Listener(d.DB)}
	holder, gate, runs, waiter := holderAndWaiter(t, d.DB, d, table, idempotency.WithSQLListener(heard))

	took := waitBehind(t, d, table, holder, waiter, true, gate, "k")
	require.EqualValues(t, 1, runs.Load())
	require.Eventually(t, func() bool { return heard.count() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the waiter's instance heard the holder let go")
	t.Logf("the duplicate was answered %v after the holder's handler returned", took)

	// A key nobody waits for: its store notifies nobody.
	gate.let("lonely")
	require.Equal(t, http.StatusCreated, post(t, holder, "lonely").StatusCode)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, heard.count(), "a key nobody waited for was notified")
}

// A listener whose connection the database ends connects again, and the
// waits after it are notified again.
func TestListenerConnectsAgain(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	table := d.Table(t, "idem_relisten")
	heard := &recordingListener{SQLListener: pgnotify.Listener(d.DB)}
	holder, gate, _, waiter := holderAndWaiter(t, d.DB, d, table, idempotency.WithSQLListener(heard))

	waitBehind(t, d, table, holder, waiter, true, gate, "before")
	require.Eventually(t, func() bool { return heard.count() == 1 }, 5*time.Second, 10*time.Millisecond)

	var ended int
	require.NoError(t, d.QueryRowContext(context.Background(), "SELECT count(pg_terminate_backend(pid)) "+
		"FROM pg_stat_activity WHERE query = $1", `LISTEN "`+table+`"`).Scan(&ended))
	require.Equal(t, 1, ended, "the listening connection")
	require.Eventually(t, func() bool { return heard.listens.Load() == 2 }, 10*time.Second, 10*time.Millisecond,
		"the listener listens again")

	waitBehind(t, d, table, holder, waiter, true, gate, "after")
	require.Eventually(t, func() bool { return heard.count() == 2 }, 5*time.Second, 10*time.Millisecond,
		"the wait after the reconnection was notified")
}

// A listener that can never listen (a database that is not pgx's) is
// logged once, and its waiters poll: they still get the first answer.
func TestListenerThatCannotListenPolls(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	other := sqltest.Open(t, sqltest.SQLite)
	table := d.Table(t, "idem_deaf")
	var log syncbuf.Buffer
	holder, gate, runs, waiter := holderAndWaiter(t, d.DB, d, table,
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))),
		idempotency.WithSQLListener(pgnotify.Listener(other.DB)))

	for _, key := range []string{"a", "b"} {
		waitBehind(t, d, table, holder, waiter, false, gate, key)
	}
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, 1, strings.Count(log.String(), "cannot listen"), log.String())
	require.Contains(t, log.String(), "not pgx")
}

// Only PostgreSQL notifies: NewSQL refuses a listener on another database.
func TestListenerOnlyOnPostgreSQL(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	require.PanicsWithValue(t, "idempotency: WithSQLListener: only PostgreSQL notifies; on SQLite waiting duplicates poll",
		func() {
			idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLListener(pgnotify.Listener(d.DB)))
		})
}

// gatedShop is a key-mode route on m whose handler, for each key, waits
// until the test closes the key's gate.
// holderAndWaiter serves two instances on table of db: a holder whose
// handler waits at each key's gate, and a waiter that waits up to 20 s
// for a key it finds held, with waiterOpts.
func holderAndWaiter(t *testing.T, db *sql.DB, d *sqltest.DB, table string, waiterOpts ...idempotency.Option) (holder *httptest.Server, gate *gates, runs *atomic.Int32, waiter *httptest.Server) {
	holder, gate, runs = gatedShop(t, idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(table),
		idempotency.WithSharedKeys()))
	waiter, _ = shop(t, idempotency.NewSQL(db, d.Dialect, append([]idempotency.Option{idempotency.WithSQLTable(table),
		idempotency.WithSharedKeys(), idempotency.WithWaitTimeout(20 * time.Second)}, waiterOpts...)...))
	return holder, gate, runs, waiter
}

// A test that fails opens every gate, so that its server closes.
func gatedShop(t *testing.T, m *idempotency.Middleware) (*httptest.Server, *gates, *atomic.Int32) {
	g := &gates{open: map[string]chan struct{}{}}
	runs := new(atomic.Int32)
	srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-g.gate(r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid "+r.Header.Get("Idempotency-Key"))
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(g.openAll) // before the server closes
	return srv, g, runs
}

// gates hold each key's handler until the test opens the key's gate.
type gates struct {
	mu     sync.Mutex
	open   map[string]chan struct{}
	opened map[string]bool
}

func (g *gates) gate(key string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open[key] == nil {
		g.open[key] = make(chan struct{})
	}
	return g.open[key]
}

// let opens key's gate.
func (g *gates) let(key string) {
	ch := g.gate(key)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.opened == nil {
		g.opened = map[string]bool{}
	}
	if !g.opened[key] {
		g.opened[key] = true
		close(ch)
	}
}

func (g *gates) openAll() {
	g.mu.Lock()
	keys := slices.Collect(maps.Keys(g.open))
	g.mu.Unlock()
	for _, key := range keys {
		g.let(key)
	}
}

// waitBehind sends key to holder, and a duplicate to waiter once the
// holder runs it; once the duplicate waits (it marked the key's row, when
// its instance listens; a while, when not), it opens the key's gate. The duplicate must replay the holder's answer. It
// returns how long after the gate opened the duplicate was answered.
func waitBehind(t *testing.T, d *sqltest.DB, table string, holder, waiter *httptest.Server, listens bool, gate *gates, key string) time.Duration {
	count := func(where string) int { // -1 before the table exists
		n := -1
		d.QueryRowContext(context.Background(), "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n)
		return n
	}
	first := make(chan *http.Response, 1)
	go func() { first <- post(t, holder, key) }()
	// One key is held at a time; the keys before stay marked as waited for
	// until their waits' ends.
	require.Eventually(t, func() bool { return count("holder <> ''") == 1 }, 10*time.Second, 5*time.Millisecond,
		"the holder claims %s", key)
	waited := count("waiting_until > 0")
	second := make(chan *http.Response, 1)
	go func() { second <- post(t, waiter, key) }()
	if listens {
		require.Eventually(t, func() bool { return count("waiting_until > 0") > waited }, 10*time.Second,
			5*time.Millisecond, "the duplicate of %s waits", key)
	} else {
		time.Sleep(300 * time.Millisecond)
		require.Equal(t, waited, count("waiting_until > 0"), "a waiter that does not listen marks no row")
	}
	opened := time.Now()
	gate.let(key)
	require.Equal(t, http.StatusCreated, (<-first).StatusCode)
	resp := <-second
	took := time.Since(opened)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	return took
}

// recordingListener is a listener that counts its listens and what it
// delivered.
type recordingListener struct {
	idempotency.SQLListener
	listens atomic.Int32
	mu      sync.Mutex
	heard   []string
}

func (l *recordingListener) Listen(ctx context.Context, channel string, listening func(), deliver func(string)) error {
	return l.SQLListener.Listen(ctx, channel, func() {
		l.listens.Add(1)
		listening()
	}, func(payload string) {
		l.mu.Lock()
		l.heard = append(l.heard, payload)
		l.mu.Unlock()
		deliver(payload)
	})
}

func (l *recordingListener) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(slices.Compact(slices.Clone(l.heard)))
}

// The listener's connection is its own, outside the pool: a pool of one
// connection still serves the holder, the waiter and the listener.
func TestListenerTakesNoPooledConnection(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	db, err := sql.Open(d.Driver, d.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	table := d.Table(t, "idem_pool")
	heard := &recordingListener{SQLListener: pgnotify.Listener(db)}
	holder, gate, runs, waiter := holderAndWaiter(t, db, d, table, idempotency.WithSQLListener(heard))

	waitBehind(t, d, table, holder, waiter, true, gate, "k")
	require.EqualValues(t, 1, runs.Load())
	require.Eventually(t, func() bool { return heard.count() == 1 }, 5*time.Second, 10*time.Millisecond)
}

// A listener that does not listen (it cannot connect) holds no waiter up:
// past a first poll's pause, the waiter polls, and marks no row. (A
// waiter that waited for it would wait out its store timeout, here 15 s.)
func TestListenerThatDoesNotListenYetPolls(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	table := d.Table(t, "idem_mute")
	holder, gate, runs, waiter := holderAndWaiter(t, d.DB, d, table, idempotency.WithSQLListener(mute{}),
		idempotency.WithStoreTimeout(15*time.Second))
	for _, key := range []string{"a", "b"} {
		took := waitBehind(t, d, table, holder, waiter, false, gate, key)
		require.Less(t, took, 7*time.Second, "the waiter polled rather than wait for the listener")
	}
	require.EqualValues(t, 2, runs.Load())
}

// mute is a listener that never listens, as one whose database refuses
// its connection.
type mute struct{}

func (mute) Listen(ctx context.Context, _ string, _ func(), _ func(string)) error {
	<-ctx.Done()
	return nil
}
