package servertest_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// protected serves fn behind the middleware with a Store on a new outcome
// table, and returns the server and the Store.
func protected(t *testing.T, d *sqltest.DB, fn sqlidem.TxFunc, storeOpts ...sqlidem.Option) (*httptest.Server, *sqlidem.Store) {
	t.Helper()
	store, err := sqlidem.New(d.DB, d.Dialect, append([]sqlidem.Option{sqlidem.WithTable(d.Table(t, "outcomes"))}, storeOpts...)...)
	must(t, err)
	must(t, store.CreateTable(t.Context()))
	prefix := "sqlidem-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	m := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithOutcomeStore(store), idempotency.WithResponseCache(0, 0))
	srv := httptest.NewServer(m.ProtectKey(store.Handler(fn)))
	t.Cleanup(srv.Close)
	return srv, store
}

// postKey posts to srv under key and returns the reply.
func postKey(t *testing.T, srv *httptest.Server, key string) reply {
	req, _ := http.NewRequest("POST", srv.URL+"/", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	return replyOf(res)
}

// Two keys have nothing in common, at every isolation level: the outcome
// row's own reads and writes never make one abort the other. Each
// transaction runs once (WithAttempts(1)), so an abort would show as a 503.
func TestDifferentKeysNeverConflict(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		levels := []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}
		if d.Kind == sqltest.SQLite {
			levels = []sql.IsolationLevel{sql.LevelDefault}
		}
		for _, level := range levels {
			t.Run(level.String(), func(t *testing.T) {
				srv, _ := protected(t, d, func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
					time.Sleep(20 * time.Millisecond) // the transactions overlap
					w.WriteHeader(http.StatusCreated)
					return nil
				}, sqlidem.WithIsolation(level), sqlidem.WithAttempts(1))
				for round := range 3 {
					var wg sync.WaitGroup
					for i := range 10 {
						wg.Go(func() {
							if r := postKey(t, srv, fmt.Sprintf("r%d-k%d", round, i)); r.status != http.StatusCreated {
								t.Errorf("round %d, key %d: %d %s; want 201", round, i, r.status, r.problem)
							}
						})
					}
					wg.Wait()
				}
			})
		}
	})
}
