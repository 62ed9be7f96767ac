package sqlstoretest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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
// of 16). Under 4, the store cannot keep a connection for running keys.
// A pool capped after NewSQL, before the first request, is judged as
// capped; SQLite's is not judged, having no connection limit to pass.
func TestAPoolThatFailsTheStoreIsLoggedOnce(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for _, c := range []struct {
			limit int
			told  string
		}{{0, "has no limit"}, {2, "too small"}, {16, ""}} {
			db, err := sql.Open(d.Driver, d.DSN)
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			var log syncbuf.Buffer
			m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSharedKeys(),
				idempotency.WithSQLTable(d.Table(t, "idem_pools")),
				idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
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
		for _, viaSqlidem := range []bool{false, true} {
			t.Run(map[bool]string{false: "own-tx", true: "sqlidem"}[viaSqlidem], func(t *testing.T) {
				t.Parallel() // each on a pool of its own
				leasesOutlastAFullPool(t, d, viaSqlidem)
			})
		}
	})
}

func leasesOutlastAFullPool(t *testing.T, d *sqltest.DB, viaSqlidem bool) {
	const pool, requests, hold = 4, 8, 1200 * time.Millisecond
	db, err := sql.Open(d.Driver, d.DSN)
	require.NoError(t, err)
	db.SetMaxOpenConns(pool)
	t.Cleanup(func() { db.Close() })
	effects := effectsTable(t, d)
	var log syncbuf.Buffer
	opts := []idempotency.Option{idempotency.WithSQLTable(d.Table(t, "idem_pool")), idempotency.WithSharedKeys(),
		idempotency.WithLockLease(time.Second), idempotency.WithRetryAbandoned(),
		idempotency.WithStoreTimeout(5 * time.Second), idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))}
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
	require.Equal(t, requests, ran, "each handler's effects committed once")
	require.NotContains(t, log.String(), "lease", "log:\n%s", log.String())
}

// A request refused because every connection of the pool is in use says
// so in the log: the database answers, and what to size is the pool.
func TestAFullPoolIsNamedInTheLog(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db, err := sql.Open(d.Driver, d.DSN)
		require.NoError(t, err)
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { db.Close() })
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_full")),
			idempotency.WithSharedKeys(), idempotency.WithStoreTimeout(300*time.Millisecond),
			idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
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
		require.Contains(t, log.String(), "every connection of db's pool is in use")
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
		ctx := context.Background()
		db, err := sql.Open(d.Driver, d.DSN)
		require.NoError(t, err)
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		t.Cleanup(func() { db.Close() })
		var log syncbuf.Buffer
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_killed")),
			idempotency.WithSharedKeys(), idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
		srv, runs := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "before").StatusCode)

		// Every idle connection of the pool, killed by the server.
		idPerConn := map[sqltest.Kind]string{sqltest.PostgreSQL: "SELECT pg_backend_pid()", sqltest.MySQL: "SELECT CONNECTION_ID()"}
		kill := map[sqltest.Kind]string{sqltest.PostgreSQL: "SELECT pg_terminate_backend(%d)", sqltest.MySQL: "KILL %d"}
		var conns []*sql.Conn
		var ids []int64
		for db.Stats().Idle > 0 || len(conns) == 0 {
			c, err := db.Conn(ctx)
			require.NoError(t, err)
			var id int64
			require.NoError(t, c.QueryRowContext(ctx, idPerConn[d.Kind]).Scan(&id))
			conns, ids = append(conns, c), append(ids, id)
		}
		for _, c := range conns {
			c.Close()
		}
		for _, id := range ids {
			_, err := d.ExecContext(ctx, fmt.Sprintf(kill[d.Kind], id))
			require.NoError(t, err)
		}
		time.Sleep(100 * time.Millisecond) // the server has closed them

		for i := range 3 {
			resp := post(t, srv, fmt.Sprint("after-", i))
			require.Equal(t, http.StatusCreated, resp.StatusCode, "killed connections: %d; log:\n%s", len(ids), log.String())
		}
		require.EqualValues(t, 4, runs.Load())
	})
}
