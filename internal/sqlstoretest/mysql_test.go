package sqlstoretest

import (
	"bytes"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// With clientFoundRows, MySQL counts a row an INSERT … ON DUPLICATE KEY
// UPDATE found as affected: a claim must not take that for its own
// insert, or a duplicate on another instance runs the key again.
func TestMySQLClientFoundRowsRunsOnce(t *testing.T) {
	d := sqltest.Open(t, sqltest.MySQL)
	dsn := d.DSN + "?clientFoundRows=true"
	if strings.Contains(d.DSN, "?") {
		dsn = d.DSN + "&clientFoundRows=true"
	}
	db, err := sql.Open(d.Driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	table := d.Table(t, "idem_found")
	var servers []*httptest.Server
	var runs []*atomic.Int32
	for range 2 {
		m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		srv, n := shop(t, m)
		require.Equal(t, http.StatusCreated, post(t, srv, "warm-"+srv.URL).StatusCode) // the instance knows its table
		servers, runs = append(servers, srv), append(runs, n)
	}
	require.Equal(t, http.StatusCreated, post(t, servers[0], "order-1").StatusCode)
	again := post(t, servers[1], "order-1")
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader), "the other instance replays")
	require.EqualValues(t, 2, runs[0].Load()+runs[1].Load()-1, "order-1 ran once (and each warm key once)")
}

// An answer larger than MySQL takes in one statement (max_allowed_packet)
// can never be stored: it is stored as not replayable, as one over
// WithMaxResponseBytes is, and a duplicate is told so at once instead of
// waiting for a store that never lands.
func TestMySQLAnswerOverThePacketIsNotReplayable(t *testing.T) {
	d := sqltest.Open(t, sqltest.MySQL)
	var packet int
	require.NoError(t, d.QueryRowContext(t.Context(), "SELECT @@max_allowed_packet").Scan(&packet))
	if packet > 64<<20 {
		t.Skipf("max_allowed_packet is %d bytes: an answer over it is too large for this test", packet)
	}
	body := bytes.Repeat([]byte{0, 0xff, 'x'}, packet/3+1)
	m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_packet")),
		idempotency.WithSharedKeys(), idempotency.WithMaxResponseBytes(2*len(body)))
	var runs atomic.Int32
	srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Write(body)
	})))
	t.Cleanup(srv.Close)

	req := func() (*http.Response, []byte) { return postRead(t, srv, "big") }
	resp, got := req()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, bytes.Equal(body, got), "the first caller gets the whole answer")
	resp, got = req()
	require.Equal(t, http.StatusConflict, resp.StatusCode, "%.200s", got)
	require.Contains(t, string(got), "not-replayable")
	require.EqualValues(t, 1, runs.Load())
}

// NewSQL refuses, at start-up, a key prefix its id column cannot hold.
func TestNewSQLRefusesAPrefixTheTableCannotHold(t *testing.T) {
	d := sqltest.Open(t, sqltest.SQLite)
	for _, prefix := range []string{"nul\x00x", "bad\xffutf8", strings.Repeat("p", 300)} {
		require.Panics(t, func() {
			idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithKeyPrefix(prefix), idempotency.WithSharedKeys())
		}, "%q", prefix)
	}
}
