package sqlstoretest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/onceonly/idempotency/sqlidem"
)

// A pool that fails the store is logged once, at the first claims. With
// no limit, a burst of new keys opens a connection per request, and the
// server refuses those past its limit while it is healthy (387 of 400
// answered 503 at once on PostgreSQL's 100 connections; none with a pool
// of 16). Under 4, the store cannot keep a connection for running keys;
// under 6, it keeps one and no spare, should the server end that one.
// A pool capped after NewSQL, before the first request, is judged as
// capped; SQLite's is not judged, having no connection limit to pass.
func TestAPoolThatFailsTheStoreIsLoggedOnce(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for _, c := range []struct {
			limit int
			told  string
		}{{0, "has no limit"}, {2, "too small"}, {5, "no spare"}, {6, ""}, {16, ""}} {
			db := openPool(t, d, 0, "")
			var log syncbuf.Buffer
			m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSharedKeys(),
				idempotency.WithSQLTable(d.Table(t, "idem_pools")),
				idempotency.WithLogger(loggerTo(&log)))
			db.SetMaxOpenConns(c.limit)
			srv, _ := shop(t, m)
			for i := range 3 {
				require.Equal(t, http.StatusCreated, post(t, srv, fmt.Sprint("pools-", i)).StatusCode)
			}
			warnings := strings.Count(log.String(), "SetMaxOpenConns")
			if c.told == "" || d.Kind == sqltest.SQLite {
				require.Zero(t, warnings, "pool of %d, log: %s", c.limit, log.String())
				continue
			}
			require.Equal(t, 1, warnings, "pool of %d, log: %s", c.limit, log.String())
			require.Contains(t, log.String(), c.told)
		}
	})
}

// Handlers whose transactions take every connection of a capped pool
// (sqlidem's must share the pool of the keys) keep their keys: the
// statements of a run that holds its lease (renewals, the store of its
// answer) never wait behind those transactions for a connection, so no
// lease lapses because the pool is busy, no run is cut, and a client's
// retry replays the one answer. With eight 1.2 s transactions on a pool
// of 4 and a 1 s lease, renewals that queued for the pool lost every
// lease, and WithRetryAbandoned then ran each handler a second time.
func TestLeasesOutlastAPoolFullOfHandlers(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		for _, c := range []struct {
			name       string
			viaSqlidem bool
			raisedFrom int
		}{{"own-tx", false, 0}, {"sqlidem", true, 0}, {"pool-raised-from-2", false, 2}} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel() // each on a pool of its own
				leasesOutlastAFullPool(t, d, c.viaSqlidem, c.raisedFrom)
			})
		}
	})
}

// leasesOutlastAFullPool is one case of TestLeasesOutlastAPoolFullOfHandlers.
// With raisedFrom, the pool holds that many connections at the first
// claim (too few for a line), and 4 from a while before the handlers
// come.
func leasesOutlastAFullPool(t *testing.T, d *sqltest.DB, viaSqlidem bool, raisedFrom int) {
	const pool, requests, hold = 4, 8, 1200 * time.Millisecond
	db := openPool(t, d, pool, "")
	effects := effectsTable(t, d)
	var log syncbuf.Buffer
	opts := []idempotency.Option{idempotency.WithSQLTable(d.Table(t, "idem_pool")), idempotency.WithSharedKeys(),
		idempotency.WithLockLease(time.Second), idempotency.WithRetryAbandoned(),
		idempotency.WithStoreTimeout(5 * time.Second), idempotency.WithLogger(loggerTo(&log))}
	pay := func(ctx context.Context, tx *sql.Tx, key string) error {
		if _, err := tx.ExecContext(ctx, d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"), key); err != nil {
			return err
		}
		select { // the transaction holds its connection meanwhile
		case <-time.After(hold):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var handler http.Handler
	if viaSqlidem {
		outcomes, err := sqlidem.New(db, d.Dialect, sqlidem.WithTable(d.Table(t, "idem_outcomes")))
		require.NoError(t, err)
		require.NoError(t, outcomes.CreateTable(context.Background()))
		opts = append(opts, idempotency.WithOutcomeStore(outcomes))
		handler = outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
			if err := pay(r.Context(), tx, r.Header.Get("Idempotency-Key")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})
	} else {
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := db.BeginTx(r.Context(), nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if err := pay(r.Context(), tx, r.Header.Get("Idempotency-Key")); err != nil {
				tx.Rollback()
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if err := tx.Commit(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
	}
	srv := httptest.NewServer(idempotency.NewSQL(db, d.Dialect, opts...).ProtectKey(handler))
	t.Cleanup(srv.Close)
	if raisedFrom > 0 {
		db.SetMaxOpenConns(raisedFrom)
		require.Equal(t, http.StatusCreated, post(t, srv, "pool-first").StatusCode)
		db.SetMaxOpenConns(pool)
		time.Sleep(6 * time.Second) // the line looks at the pool again (holderLineTend)
	}

	statuses := make(chan int, requests)
	for i := range requests {
		go func() {
			resp := postAsync(srv, fmt.Sprintf("pool-%d", i))
			if resp == nil {
				statuses <- 0
				return
			}
			statuses <- resp.StatusCode
		}()
	}
	for range requests {
		require.Equal(t, http.StatusCreated, <-statuses, "log:\n%s", log.String())
	}
	for i := range requests { // a client's retry replays the one answer
		resp := post(t, srv, fmt.Sprintf("pool-%d", i))
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	}
	var ran int
	require.NoError(t, d.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+effects).Scan(&ran))
	require.Equal(t, requests+min(raisedFrom, 1), ran, "each handler's effects committed once")
	require.NotContains(t, log.String(), "lock lost", "log:\n%s", log.String())
}

// A request refused because every connection of the pool is in use says
// so in the log: the database answers, and what to size is the pool.
func TestAFullPoolIsNamedInTheLog(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db := openPool(t, d, 4, "")
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_full")),
			idempotency.WithSharedKeys(), idempotency.WithStoreTimeout(300*time.Millisecond),
			idempotency.WithLogger(loggerTo(&log)))
		release := make(chan struct{})
		holding := make(chan struct{}, 4)
		srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := db.BeginTx(r.Context(), nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer tx.Rollback()
			holding <- struct{}{}
			<-release
			w.WriteHeader(http.StatusCreated)
		})))
		t.Cleanup(srv.Close)

		held := make(chan *http.Response, 3)
		for i := range 3 { // with the line's connection, the pool's four
			go func() { held <- postAsync(srv, fmt.Sprint("full-", i)) }()
			<-holding
		}
		resp := postAsync(srv, "full-refused")
		close(release)
		require.NotNil(t, resp)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Contains(t, log.String(), "no connection of db's pool came free")
		require.NotContains(t, log.String(), "the database does not answer")
		for range 3 {
			r := <-held
			require.NotNil(t, r)
			require.Equal(t, http.StatusCreated, r.StatusCode)
		}
	})
}

// postAsync is post for a goroutine: nil when the request failed.
func postAsync(srv *httptest.Server, key string) *http.Response {
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":5}`))
	if err != nil {
		return nil
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return nil
	}
	resp.Body.Close()
	return resp
}

// A claim that meets a pooled connection the server has closed (a
// database restarted, an idle connection killed) goes on with another,
// as database/sql does with its pool's: the request runs, it is not
// refused 503.
func TestAClaimMovesPastAKilledConnection(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db := openPool(t, d, 8, "")
		db.SetMaxIdleConns(8)
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_killed")),
			idempotency.WithSharedKeys(), idempotency.WithLogger(loggerTo(&log)))
		srv, runs := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "before").StatusCode)

		ids := killIdle(t, db, d)

		for i := range 3 {
			resp := post(t, srv, fmt.Sprint("after-", i))
			require.Equal(t, http.StatusCreated, resp.StatusCode, "killed connections: %d; log:\n%s", len(ids), log.String())
		}
		require.EqualValues(t, 4, runs.Load())
	})
}

// killIdle has the server end every idle connection of db's pool (at
// least one), and returns their ids.
func killIdle(t *testing.T, db *sql.DB, d *sqltest.DB) []int64 {
	ctx := context.Background()
	var conns []*sql.Conn
	var ids []int64
	for db.Stats().Idle > 0 || len(conns) == 0 {
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		var id int64
		require.NoError(t, c.QueryRowContext(ctx, ownConnectionID[d.Kind]).Scan(&id))
		conns, ids = append(conns, c), append(ids, id)
	}
	for _, c := range conns {
		c.Close()
	}
	for _, id := range ids {
		kill(t, d, id)
	}
	time.Sleep(100 * time.Millisecond) // the server has closed them
	return ids
}

// ownConnectionID asks the server for the id of the connection it runs on.
var ownConnectionID = map[sqltest.Kind]string{sqltest.PostgreSQL: "SELECT pg_backend_pid()", sqltest.MySQL: "SELECT CONNECTION_ID()"}

// kill has the server end the connection id, from another connection.
func kill(t *testing.T, d *sqltest.DB, id int64) {
	statement := map[sqltest.Kind]string{sqltest.PostgreSQL: "SELECT pg_terminate_backend(%d)", sqltest.MySQL: "KILL %d"}
	_, err := d.ExecContext(context.Background(), fmt.Sprintf(statement[d.Kind], id))
	require.NoError(t, err)
}

// The line stays while a key it serves runs, however long after the last
// claim: a run of 40 s, on a pool whose other connections are held and
// wanted, keeps its lease, and a duplicate replays its one answer.
func TestTheLineStaysWhileAKeyRuns(t *testing.T) {
	t.Parallel() // 40 s of waiting, on pools of 4
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		t.Parallel()
		const pool, lasts = 4, 40 * time.Second // past the line's idle time, 30 s
		db := openPool(t, d, pool, "")
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_stays")),
			idempotency.WithSharedKeys(), idempotency.WithLockLease(time.Second), idempotency.WithRetryAbandoned(),
			idempotency.WithExecutionTimeout(time.Minute), idempotency.WithWaitTimeout(time.Minute),
			idempotency.WithLogger(loggerTo(&log)))
		var cut atomic.Bool
		srv, runs := shopWith(t, m, func(r *http.Request) {
			tx, err := db.BeginTx(r.Context(), nil)
			if err != nil {
				cut.Store(true)
				return
			}
			defer tx.Rollback()
			select {
			case <-time.After(lasts):
			case <-r.Context().Done(): // its lease lost
				cut.Store(true)
			}
		})
		first := make(chan *http.Response, 1)
		go func() { first <- postAsync(srv, "long") }()
		require.Eventually(t, func() bool { return runs.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
		// The pool's other connections: two held, and one more wanted.
		for range 2 {
			tx, err := db.BeginTx(context.Background(), nil)
			require.NoError(t, err)
			t.Cleanup(func() { tx.Rollback() })
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), lasts+10*time.Second)
			defer cancel()
			if tx, err := db.BeginTx(ctx, nil); err == nil {
				<-ctx.Done() // and holds what it got
				tx.Rollback()
			}
		}()
		time.Sleep(lasts - 2*time.Second)
		second := postAsync(srv, "long") // waits for the run, then replays it
		resp := <-first
		require.NotNil(t, resp)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "log:\n%s", log.String())
		require.NotNil(t, second)
		require.Equal(t, http.StatusCreated, second.StatusCode)
		require.Equal(t, "true", second.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 1, runs.Load(), "the key ran once")
		require.False(t, cut.Load(), "the run was not cut off; log:\n%s", log.String())
	})
}

// A pool lowered under 4 gets the line's connection back within a few
// seconds: the line does not keep the only connection of a pool of 1.
func TestALoweredPoolGetsTheLineBack(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db := openPool(t, d, 8, "")
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_lowered")),
			idempotency.WithSharedKeys(), idempotency.WithStoreTimeout(200*time.Millisecond))
		srv, _ := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "before").StatusCode) // the line is filled
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(0) // no idle connection left: the line holds the pool's one
		i := 0
		require.Eventually(t, func() bool {
			i++
			return post(t, srv, fmt.Sprint("after-", i)).StatusCode == http.StatusCreated
		}, 8*time.Second, 200*time.Millisecond)
	})
}

// Closing db gives the line's connection back to the server within a few
// seconds, as it closes the pool's own.
func TestClosingTheDatabaseClosesTheLine(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	name := fmt.Sprintf("idemline%d", time.Now().UnixNano())
	db := openPool(t, d, 8, "&application_name="+name)
	m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_close")), idempotency.WithSharedKeys())
	srv, _ := shop(t, m)
	require.Equal(t, http.StatusCreated, post(t, srv, "k").StatusCode)
	open := func() int {
		var n int
		require.NoError(t, d.QueryRowContext(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name).Scan(&n))
		return n
	}
	require.Positive(t, open())
	require.NoError(t, db.Close())
	require.Eventually(t, func() bool { return open() == 0 }, 8*time.Second, 100*time.Millisecond)
}

// Closing db while keys run ends the background work that their stores
// and releases left: it is logged, not tried for as long as the process
// lives (32 goroutines per Middleware, each every 500 ms).
func TestClosingTheDatabaseEndsTheBackgroundWork(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		db := openPool(t, d, 8, "")
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_closed")),
			idempotency.WithSharedKeys(), idempotency.WithLogger(loggerTo(&log)))
		srv, runs := shopWith(t, m, func(*http.Request) { time.Sleep(300 * time.Millisecond) })
		done := make(chan *http.Response, 3)
		for i := range 3 {
			go func() { done <- postAsync(srv, fmt.Sprint("closing-", i)) }()
		}
		require.Eventually(t, func() bool { return runs.Load() == 3 }, 5*time.Second, 5*time.Millisecond)
		require.NoError(t, db.Close()) // while the three run
		for range 3 {
			<-done
		}
		require.Eventually(t, func() bool { return backgroundJobs() == 0 }, 5*time.Second, 50*time.Millisecond,
			"log:\n%s", log.String())
		require.Contains(t, log.String(), "the database (*sql.DB) was closed")
	})
}

// backgroundJobs counts the goroutines of the middleware's background
// queue.
func backgroundJobs() int {
	var stacks bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&stacks, 2)
	return strings.Count(stacks.String(), "idempotency.(*later).do(")
}

// A pool of 6 or more spares the line a second connection: when the
// server ends the line's connection while every other one is held (and
// wanted), and a new one takes longer than a lease to open, the running
// keys' renewals go on on the spare, and no lease lapses. (PostgreSQL,
// whose backends this test can tell apart.)
func TestTheLinesSpareOutlivesItsConnection(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	const pool, requests, hold = 6, 4, 2500 * time.Millisecond // the smallest pool with a spare
	name := fmt.Sprintf("idemspare%d", time.Now().UnixNano())
	var dialDelay atomic.Int64
	db := openDelayedDials(t, d, &dialDelay, "&application_name="+name)
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	var log syncbuf.Buffer
	m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_spare")),
		idempotency.WithSharedKeys(), idempotency.WithLockLease(time.Second), idempotency.WithRetryAbandoned(),
		idempotency.WithStoreTimeout(5*time.Second), idempotency.WithLogger(loggerTo(&log)))
	var cut atomic.Int32
	holding := make(chan struct{}, requests)
	srv, runs := shopWith(t, m, holdingTransactions(db, &cut, func(*http.Request) time.Duration {
		holding <- struct{}{}
		return hold
	}))
	for i := range 2 { // two claims fill the line and its spare
		require.Equal(t, http.StatusCreated, post(t, srv, fmt.Sprint("fill-", i)).StatusCode)
	}
	done := make(chan *http.Response, requests)
	for i := range requests {
		go func() { done <- postAsync(srv, fmt.Sprint("spare-", i)) }()
	}
	for range requests {
		<-holding
	}
	waiter, cancel := context.WithTimeout(context.Background(), 2*hold)
	defer cancel()
	for range 2 { // the pool's last connection, and any freed, is wanted at once
		go func() {
			if tx, err := db.BeginTx(waiter, nil); err == nil {
				<-waiter.Done()
				tx.Rollback()
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	dialDelay.Store(int64(3 * time.Second)) // the slot it frees fills only after the leases
	terminateLine(t, d, name)               // the oldest of its idle ones
	for range requests {
		resp := <-done
		require.NotNil(t, resp)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "log:\n%s", log.String())
	}
	require.Zero(t, cut.Load(), "no run was cut off; log:\n%s", log.String())
	require.EqualValues(t, requests+2, runs.Load())
	require.NotContains(t, log.String(), "lock lost")
}

// The line trades a connection it has held for 30 s for a fresh one of
// the pool's, so the pool's own rules reach it too: under a steady stream
// of keys on a pool whose connections live 2 s (SetConnMaxLifetime, as
// operators set it to follow a failover or a proxy's rotation), none of
// the store's connections lives 30 s, and every key is answered once.
func TestTheLineFollowsThePoolsConnectionLifetime(t *testing.T) {
	t.Parallel() // 40 s of traffic
	d := sqltest.Open(t, sqltest.PostgreSQL)
	const lifetime, traffic, lineAge = 2 * time.Second, 40 * time.Second, 30 * time.Second
	name := fmt.Sprintf("idemlineage%d", time.Now().UnixNano())
	db := openPool(t, d, 8, "&application_name="+name)
	db.SetConnMaxLifetime(lifetime)
	m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_line_age")),
		idempotency.WithSharedKeys())
	srv, runs := shop(t, m)
	n := 0
	for end := time.Now().Add(traffic); time.Now().Before(end); n++ {
		require.Equal(t, http.StatusCreated, post(t, srv, fmt.Sprint("age-", n)).StatusCode)
		time.Sleep(50 * time.Millisecond)
	}
	require.EqualValues(t, n, runs.Load())
	var oldest float64
	require.NoError(t, d.QueryRowContext(context.Background(),
		"SELECT COALESCE(EXTRACT(EPOCH FROM max(now() - backend_start)), 0)::float8 FROM pg_stat_activity "+
			"WHERE application_name = $1", name).Scan(&oldest))
	age := time.Duration(oldest * float64(time.Second))
	t.Logf("after %v of keys, the store's oldest connection is %v old", traffic, age.Round(time.Millisecond))
	require.Less(t, age, lineAge, "a connection outlived the pool's lifetime of %v by the line's age", lifetime)
}

// openPool opens d again, on a pool of its own of at most limit
// connections (0: no limit), closed when t ends; dsnSuffix is appended to
// d's DSN.
func openPool(t testing.TB, d *sqltest.DB, limit int, dsnSuffix string) *sql.DB {
	db, err := sql.Open(d.Driver, d.DSN+dsnSuffix)
	require.NoError(t, err)
	db.SetMaxOpenConns(limit)
	t.Cleanup(func() { db.Close() })
	return db
}

// loggerTo is a middleware's text log written to log.
func loggerTo(log *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(log, nil)) }
