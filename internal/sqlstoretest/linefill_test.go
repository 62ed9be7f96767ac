package sqlstoretest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// A pool of fewer than 6 keeps no spare for the line. When the server
// ends the line's connection while handlers hold every other one, the
// first connection that a claim or a running key's statement gets from the
// pool fills the line again, and the running keys keep their leases. Only
// a new claim used to fill it, one that asked for the line before it got
// its connection: the claims already waiting ran on theirs and gave them
// to their handlers, the renewals waited behind them until their leases
// lapsed, and with WithRetryAbandoned another instance ran the keys
// again. (PostgreSQL, whose backends this test can tell apart.)
func TestTheLineFillsAgainFromTheNextConnection(t *testing.T) {
	d := sqltest.Open(t, sqltest.PostgreSQL)
	const pool, holders, queued, lease, hold = 5, 4, 3, 2 * time.Second, 5 * time.Second
	name := fmt.Sprintf("idemrefill%d", time.Now().UnixNano())
	db := openPool(t, d, pool, "&application_name="+name)
	db.SetMaxIdleConns(pool)
	var log syncbuf.Buffer
	m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_refill")),
		idempotency.WithSharedKeys(), idempotency.WithLockLease(lease), idempotency.WithRetryAbandoned(),
		idempotency.WithStoreTimeout(2*hold), idempotency.WithLogger(loggerTo(&log)))
	var cut atomic.Int32
	holding := make(chan struct{}, holders)
	srv, runs := shopWith(t, m, holdingTransactions(db, &cut, func(r *http.Request) time.Duration {
		// The holders' transactions take the pool for hold; the others
		// hold their connection for half of it once they have it.
		if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "held-") {
			holding <- struct{}{}
			return hold
		}
		return hold / 2
	}))
	require.Equal(t, http.StatusCreated, post(t, srv, "fill").StatusCode) // its claim fills the line
	done := make(chan *http.Response, holders+queued)
	for i := range holders { // with the line, every connection of the pool
		go func() { done <- postAsync(srv, fmt.Sprint("held-", i)) }()
	}
	for range holders {
		<-holding
	}
	for i := range queued { // their claims wait for the pool
		go func() { done <- postAsync(srv, fmt.Sprint("queued-", i)) }()
	}
	time.Sleep(200 * time.Millisecond)
	terminateLine(t, d, name) // the one idle connection
	for range holders + queued {
		resp := <-done
		require.NotNil(t, resp)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "log:\n%s", log.String())
	}
	require.Zero(t, cut.Load(), "no run was cut off; log:\n%s", log.String())
	require.EqualValues(t, 1+holders+queued, runs.Load())
	require.NotContains(t, log.String(), "lock lost")
}

// holdingTransactions is a handler's work that holds a transaction of db
// for as long as holdFor says, once it has begun it; a run cut short (its
// context ended, or no transaction) counts in cut.
func holdingTransactions(db *sql.DB, cut *atomic.Int32, holdFor func(r *http.Request) time.Duration) func(r *http.Request) {
	return func(r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			cut.Add(1)
			return
		}
		defer tx.Rollback()
		tx.ExecContext(r.Context(), "SELECT 1") // in a transaction from here on
		select {
		case <-time.After(holdFor(r)):
		case <-r.Context().Done():
			cut.Add(1)
		}
	}
}

// terminateLine has PostgreSQL end the line's connection: the oldest idle
// one of the pool whose connections name themselves name.
func terminateLine(t *testing.T, d *sqltest.DB, name string) {
	var killed bool
	require.NoError(t, d.QueryRowContext(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle' "+
			"ORDER BY backend_start LIMIT 1", name).Scan(&killed))
	require.True(t, killed)
}
