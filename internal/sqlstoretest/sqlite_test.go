package sqlstoretest

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// Two instances on one SQLite file, each with its own connections and its
// own lock of the process, as two processes of one machine have: SQLite's
// file lock orders their transactions, and every key runs once.
func TestSQLiteInstancesShareAFile(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	table := d.Table(t, "idem_file")
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d for %s", n, r.Header.Get("Idempotency-Key"))
	})
	var servers []*httptest.Server
	for range 2 {
		db, err := sql.Open(d.Driver, d.DSN)
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		m := idempotency.NewSQL(db, idempotency.SQLite, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		srv := httptest.NewServer(m.ProtectKey(handler))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	const keys, each = 8, 6
	answers := make([][]string, keys)
	var wg sync.WaitGroup
	for k := range keys {
		answers[k] = make([]string, each)
		for i := range each {
			wg.Go(func() {
				srv := servers[i%2]
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", fmt.Sprint("key-", k))
				resp, err := srv.Client().Do(req)
				if err != nil {
					answers[k][i] = err.Error()
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers[k][i] = resp.Status + " " + string(body)
			})
		}
	}
	wg.Wait()
	require.EqualValues(t, keys, runs.Load(), "each key ran once")
	for k := range keys {
		for _, a := range answers[k] {
			require.Equal(t, answers[k][0], a, "every request of key-%d got the first answer", k)
		}
		require.True(t, strings.HasPrefix(answers[k][0], "201 Created run "), answers[k][0])
	}
}

// Instances that start together on a database without the table each
// create it, and none of their first requests fails for it.
func TestInstancesCreateTheTableTogether(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_fresh")
		var wg sync.WaitGroup
		codes := make([]int, 8)
		for i := range codes {
			m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
			srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			})))
			t.Cleanup(srv.Close)
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", fmt.Sprint("first-", i))
				resp, err := srv.Client().Do(req)
				if err == nil {
					codes[i] = resp.StatusCode
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		for i, code := range codes {
			require.Equal(t, http.StatusCreated, code, "instance %d", i)
		}
	})
}
