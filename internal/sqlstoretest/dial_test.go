package sqlstoretest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// A database slow to open new connections (a server busy starting
// backends, its accept queue full in a storm of dials) does not cost a
// running key its lease while the store keeps a connection for running
// keys: a renewal or a store that would wait for a dial takes that
// connection after a short wait. When they waited for their dials, a
// handler that outlived its lease lost it (the dial outlasted the lease),
// its run was cut, and the client's retry ran it again.
func TestLeasesOutlastSlowNewConnections(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		var dialDelay atomic.Int64
		db := openDelayedDials(t, d, &dialDelay, "")
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(0) // every statement on the pool dials
		var log syncbuf.Buffer
		table := d.Table(t, "idem_dials")
		opts := []idempotency.Option{idempotency.WithSQLTable(table), idempotency.WithSharedKeys(),
			idempotency.WithLockLease(time.Second), idempotency.WithRetryAbandoned(), idempotency.WithLogger(loggerTo(&log))}
		var runs atomic.Int32
		started := make(chan struct{}, 2)
		slow := func(r *http.Request) {
			runs.Add(1)
			if r.Header.Get("Idempotency-Key") == "slow-dials" {
				dialDelay.Store(int64(3 * time.Second)) // from now on, past the lease
				started <- struct{}{}
				time.Sleep(2500 * time.Millisecond) // two leases and a half
			}
		}
		srv, _ := shopWith(t, idempotency.NewSQL(db, d.Dialect, opts...), slow)
		// Another instance, whose connections open at once.
		other, _ := shopWith(t, idempotency.NewSQL(openPool(t, d, 8, ""), d.Dialect, opts...), slow)
		// The first claim, at full speed, leaves its connection to the
		// store's line.
		require.Equal(t, http.StatusCreated, post(t, srv, "fast-dials").StatusCode)

		first := make(chan *http.Response, 1)
		go func() { first <- postAsync(srv, "slow-dials") }()
		<-started
		time.Sleep(1500 * time.Millisecond) // past the lease, had no renewal landed
		retry := post(t, other, "slow-dials")
		resp := <-first
		require.NotNil(t, resp)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "log:\n%s", log.String())
		require.Equal(t, http.StatusCreated, retry.StatusCode, "the retry waits for the run it met, log:\n%s", log.String())
		require.Equal(t, "true", retry.Header.Get(idempotency.ReplayedHeader))
		require.EqualValues(t, 2, runs.Load(), "each key ran once")
		require.NotContains(t, log.String(), "lock lost")
	})
}

// openDelayedDials opens d, its DSN followed by dsnSuffix, with every new
// connection's dial delayed by what delay holds.
func openDelayedDials(t *testing.T, d *sqltest.DB, delay *atomic.Int64, dsnSuffix string) *sql.DB {
	db, err := sqltest.OpenWrapped(d.Driver, d.DSN+dsnSuffix, func(c driver.Connector) driver.Connector {
		return delayedConnector{Connector: c, delay: delay}
	})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// A delayedConnector is a driver's connector whose dials wait first.
type delayedConnector struct {
	driver.Connector
	delay *atomic.Int64
}

func (c delayedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	select {
	case <-time.After(time.Duration(c.delay.Load())):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return c.Connector.Connect(ctx)
}
