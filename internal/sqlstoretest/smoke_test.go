package sqlstoretest

import (
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

func TestSmoke(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_keys")
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithSharedKeys())
		var runs atomic.Int32
		srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			w.WriteHeader(201)
			io.WriteString(w, "order "+string(rune('0'+n)))
		})))
		defer srv.Close()
		var wg sync.WaitGroup
		bodies := make([]string, 10)
		for i := range bodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
				req.Header.Set("Idempotency-Key", "k1")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				bodies[i] = resp.Status + " " + string(b)
			}()
		}
		wg.Wait()
		require.EqualValues(t, 1, runs.Load())
		for _, b := range bodies {
			require.Equal(t, "201 Created order 1", b)
		}
	})
}
