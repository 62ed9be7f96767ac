package sqlstoretest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// BenchmarkFirstExecution is a first execution with the keys in each
// database, one at a time, from the request to the stored answer, on a
// pool of 8 (so that the store keeps a connection for running keys). The
// handler does nothing: the figures are the middleware's and its
// database's.
//
//	go test -run '^$' -bench FirstExecution -benchmem ./internal/sqlstoretest
func BenchmarkFirstExecution(b *testing.B) {
	for _, kind := range []sqltest.Kind{sqltest.SQLite, sqltest.PostgreSQL, sqltest.MySQL} {
		b.Run(string(kind), func(b *testing.B) {
			// Set up once: the sub-benchmark below runs for each b.N.
			d := sqltest.Open(b, kind)
			db := openPool(b, d, 8, "")
			m := idempotency.NewSQL(db, d.Dialect, idempotency.WithSQLTable(d.Table(b, "idem_bench")), idempotency.WithSharedKeys())
			h := m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			}))
			b.Run("first", func(b *testing.B) {
				run := time.Now().UnixNano() // the keys of each run are new
				b.ReportAllocs()
				for i := range b.N {
					req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"amount":5}`))
					req.Header.Set("Idempotency-Key", fmt.Sprint("bench-", run, "-", i))
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusCreated {
						b.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
					}
				}
			})
		})
	}
}
