package sqlstoretest

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// viaProxy opens the database of d again through a TCP proxy, which a
// test can cut or make lose a reply.
func viaProxy(t *testing.T, d *sqltest.DB) (*sql.DB, *redistest.Proxy) {
	server := d.Server()
	if server == "" {
		t.Skip("SQLite has no connection to cut")
	}
	proxy := redistest.NewProxy(t, server)
	dsn := d.Through(proxy.Addr())
	if d.Kind == sqltest.MySQL {
		// Statements as text, so that a test can name the one whose reply
		// is lost (prepared, they would go out without it).
		if strings.Contains(dsn, "?") {
			dsn += "&interpolateParams=true"
		} else {
			dsn += "?interpolateParams=true"
		}
	}
	db, err := sql.Open(d.Driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

// eachServer runs fn on PostgreSQL and MySQL/MariaDB, the databases with a
// connection to cut.
func eachServer(t *testing.T, fn func(t *testing.T, d *sqltest.DB)) {
	for _, kind := range []sqltest.Kind{sqltest.PostgreSQL, sqltest.MySQL} {
		t.Run(string(kind), func(t *testing.T) { fn(t, sqltest.Open(t, kind)) })
	}
}

// shop is a key-mode route on m that counts its runs.
func shop(t *testing.T, m *idempotency.Middleware) (*httptest.Server, *atomic.Int32) {
	return shopWith(t, m, func(*http.Request) {})
}

// shopWith is shop whose handler does work first.
func shopWith(t *testing.T, m *idempotency.Middleware, work func(r *http.Request)) (*httptest.Server, *atomic.Int32) {
	runs := new(atomic.Int32)
	srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		work(r)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid "+r.Header.Get("Idempotency-Key"))
	})))
	t.Cleanup(srv.Close)
	return srv, runs
}

// postRead is post that reads the answer's body too.
func postRead(t *testing.T, srv *httptest.Server, key string) (*http.Response, []byte) {
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

func post(t *testing.T, srv *httptest.Server, key string) *http.Response {
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// A database that does not answer is 503 store-unavailable with
// Retry-After, as a Redis that does not: nothing runs, and once it answers
// again the request runs once and what was stored before replays.
func TestDatabaseCutOffIsStoreUnavailable(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db, proxy := viaProxy(t, d)
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_cut")),
			idempotency.WithSharedKeys(), idempotency.WithStoreTimeout(300*time.Millisecond))
		srv, runs := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "before").StatusCode)

		proxy.StartBlackhole()
		resp := post(t, srv, "during")
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Contains(t, resp.Header.Get("Content-Type"), "application/problem+json")
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Error(t, m.Ready(t.Context()), "Ready says so too")
		require.EqualValues(t, 1, runs.Load(), "nothing ran while the database was cut off")
		proxy.EndBlackhole()

		require.Eventually(t, func() bool { return post(t, srv, "during").StatusCode == http.StatusCreated },
			10*time.Second, 100*time.Millisecond)
		require.EqualValues(t, 2, runs.Load())
		replay := post(t, srv, "before")
		require.Equal(t, http.StatusCreated, replay.StatusCode)
		require.Equal(t, "true", replay.Header.Get(idempotency.ReplayedHeader))
		require.NoError(t, m.Ready(t.Context()))
	})
}

// A claim whose reply is lost may or may not have been written: the
// request is refused (503), its claim undone in the background, and the
// retry runs the handler exactly once. A fresh key's claim is one INSERT;
// a key whose row exists (released before) is claimed in a transaction,
// whose COMMIT's reply is the one lost.
func TestLostClaimReplyRunsOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		for _, lost := range []struct{ name, needle string }{{"fresh", "insert into"}, {"released", "commit"}} {
			t.Run(lost.name, func(t *testing.T) {
				db, proxy := viaProxy(t, d)
				table := d.Table(t, "idem_lost")
				m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(table),
					idempotency.WithSharedKeys(), idempotency.WithLockLease(time.Second))
				var runs atomic.Int32
				release := true
				srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					if lost.name == "released" && release {
						release = false
						idempotency.Release(r.Context()) // the row stays, without a record
						w.WriteHeader(http.StatusConflict)
						return
					}
					w.WriteHeader(http.StatusCreated)
				})))
				t.Cleanup(srv.Close)
				awaitFirstPurge(t, d, m, table)
				if lost.name == "released" {
					require.Equal(t, http.StatusConflict, post(t, srv, "k").StatusCode)
				}
				before := runs.Load()

				proxy.DropNextReply(lost.needle)
				resp := post(t, srv, "k")
				require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
				require.EqualValues(t, 1, proxy.Dropped(), "the claim's reply was lost")
				require.Equal(t, before, runs.Load(), "the handler did not run")

				require.Eventually(t, func() bool { return post(t, srv, "k").StatusCode == http.StatusCreated },
					15*time.Second, 100*time.Millisecond)
				require.Equal(t, before+1, runs.Load(), "the retry ran the handler once")
				require.Equal(t, "true", post(t, srv, "k").Header.Get(idempotency.ReplayedHeader))
				require.Equal(t, before+1, runs.Load())
			})
		}
	})
}

// The store of an answer whose reply is lost is tried again in the
// background: the caller still gets its answer, and every retry replays
// it without running the handler again.
func TestLostStoreReplyKeepsTheAnswer(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db, proxy := viaProxy(t, d)
		table := d.Table(t, "idem_store")
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		srv, runs := shop(t, m)
		// No connection has prepared the store's UPDATE yet: its text goes
		// out with the first one.
		awaitFirstPurge(t, d, m, table)

		proxy.DropNextReply("case when holder") // the store's UPDATE
		require.Equal(t, http.StatusCreated, post(t, srv, "k").StatusCode)
		require.EqualValues(t, 1, proxy.Dropped())
		require.Eventually(t, func() bool {
			resp := post(t, srv, "k")
			return resp.StatusCode == http.StatusCreated && resp.Header.Get(idempotency.ReplayedHeader) == "true"
		}, 15*time.Second, 100*time.Millisecond)
		require.EqualValues(t, 1, runs.Load(), "the handler ran once")
	})
}

// awaitFirstPurge makes sure that m's first purge, which it starts when it
// first reaches its table, is over: the test creates the table with an
// expired row in it, and m's purge deletes the row. m's purges then send
// nothing for a minute, and no statement a test names has been prepared
// on a connection.
func awaitFirstPurge(t *testing.T, d *sqltest.DB, m *idempotency.Middleware, table string) {
	blob, text := "BYTEA", "TEXT"
	if d.Kind == sqltest.MySQL {
		blob, text = "LONGBLOB", "VARBINARY(512)"
	}
	_, err := d.ExecContext(t.Context(), "CREATE TABLE "+table+" (id "+text+" PRIMARY KEY, record "+blob+
		", record_until BIGINT NOT NULL DEFAULT 0, holder "+text+" NOT NULL DEFAULT '', holder_until BIGINT NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	_, err = d.ExecContext(t.Context(), d.Dialect.Bind("INSERT INTO "+table+" (id) VALUES (?)"), "planted-expired")
	require.NoError(t, err)
	require.NoError(t, m.Ready(t.Context()))
	require.Eventually(t, func() bool {
		var n int
		err := d.QueryRowContext(t.Context(), d.Dialect.Bind("SELECT COUNT(*) FROM "+table+" WHERE id = ?"),
			"planted-expired").Scan(&n)
		return err == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond, "the first purge")
}
