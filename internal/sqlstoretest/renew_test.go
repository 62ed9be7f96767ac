package sqlstoretest

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// A run that lasts many leases keeps its key: its watchdog renews the
// lease, and another instance that would take an abandoned key over
// (WithRetryAbandoned) waits for the run instead, then replays it.
func TestRenewedLeaseKeepsALongRunsKey(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_renew")
		opts := []idempotency.Option{idempotency.WithSQLTable(table), idempotency.WithSharedKeys(),
			idempotency.WithLockLease(time.Second), idempotency.WithWaitTimeout(10 * time.Second)}
		var runs atomic.Int32
		release := make(chan struct{})
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		owner := httptest.NewServer(idempotency.NewSQL(d.DB, d.Dialect, opts...).ProtectKey(handler))
		t.Cleanup(owner.Close)
		taker := httptest.NewServer(idempotency.NewSQL(d.DB, d.Dialect,
			append(opts, idempotency.WithRetryAbandoned())...).ProtectKey(handler))
		t.Cleanup(taker.Close)

		first := make(chan int, 1)
		go func() { first <- post(t, owner, "long").StatusCode }()
		require.Eventually(t, func() bool { return runs.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
		time.Sleep(3 * time.Second) // three leases: renewed, or taken over

		second := make(chan *http.Response, 1)
		go func() { second <- post(t, taker, "long") }()
		time.Sleep(time.Second) // the duplicate waits, or takes over
		close(release)
		require.Equal(t, http.StatusCreated, <-first)
		resp := <-second
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 1, runs.Load(), "the run's key was never taken over")
	})
}
