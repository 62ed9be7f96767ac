package servertest_test

import (
	"database/sql"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/onceonly/idempotency/sqlidem"
)

// A failure behind the middleware that is not the client's is logged once,
// with its cause, through the middleware's logger, and the observer sees
// it: a table that was never created (a migration not yet run), and a
// handler's own error, answered by the error handler or by the handler.
// A refusal that is the client's (a 422 the handler wrote) is not logged.
func TestFailuresBehindTheMiddlewareAreReported(t *testing.T) {
	provider := errors.New("provider declined: card expired")
	for _, tc := range []struct {
		name      string
		noTable   bool
		storeOpts []sqlidem.Option
		fn        sqlidem.TxFunc
		status    int
		logged    string // in the one error line; "" for none
		errIsCode bool   // the observer's Err wraps ErrStoreUnavailable
	}{
		{name: "no table", noTable: true, fn: ok, status: 503, errIsCode: true},
		{name: "no table, an error handler of the store's own", noTable: true, fn: ok, status: 503, errIsCode: true,
			storeOpts: []sqlidem.Option{sqlidem.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
				w.WriteHeader(idempotency.StatusCode(err))
			})}},
		{name: "handler error answered by the error handler", status: 500, logged: provider.Error(),
			fn: func(*sql.Tx, http.ResponseWriter, *http.Request) error { return provider }},
		{name: "handler error answered by the handler", status: 502, logged: provider.Error(),
			fn: func(_ *sql.Tx, w http.ResponseWriter, _ *http.Request) error {
				http.Error(w, "the provider failed", http.StatusBadGateway)
				return provider
			}},
		{name: "the client's refusal", status: 422,
			fn: func(_ *sql.Tx, w http.ResponseWriter, _ *http.Request) error {
				http.Error(w, "amount missing", http.StatusUnprocessableEntity)
				return errors.New("amount missing")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
				store, err := sqlidem.New(d.DB, d.Dialect, append([]sqlidem.Option{sqlidem.WithTable(d.Table(t, "outcomes"))}, tc.storeOpts...)...)
				must(t, err)
				if !tc.noTable {
					must(t, store.CreateTable(t.Context()))
				}
				var logs syncbuf.Buffer
				var mu sync.Mutex
				var events []idempotency.Event
				prefix := "sqlidem-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
				m := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
					idempotency.WithOutcomeStore(store), idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
					idempotency.WithObserver(func(e idempotency.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))
				srv := httptest.NewServer(m.ProtectKey(store.Handler(tc.fn)))
				t.Cleanup(srv.Close)

				if r := postKey(t, srv, "k1"); r.status != tc.status {
					t.Fatalf("answered %d %s; want %d", r.status, r.problem, tc.status)
				}
				lines := errorLines(logs.String())
				switch {
				case tc.noTable && (len(lines) != 1 || !strings.Contains(lines[0], "outcomes")):
					t.Fatalf("logged %q; want one error line that names the missing table", lines)
				case tc.logged != "" && (len(lines) != 1 || !strings.Contains(lines[0], tc.logged)):
					t.Fatalf("logged %q; want one error line with %q", lines, tc.logged)
				case !tc.noTable && tc.logged == "" && len(lines) != 0:
					t.Fatalf("logged %q for the client's own refusal", lines)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(events) != 1 {
					t.Fatalf("%d events", len(events))
				}
				switch e := events[0]; {
				case tc.logged == "" && !tc.noTable:
					// The client's refusal is no failure of the handler.
				case e.Err == nil:
					t.Fatalf("observer: %v with no Err", e.Outcome)
				case tc.errIsCode && !errors.Is(e.Err, idempotency.ErrStoreUnavailable):
					t.Fatalf("observer: Err %v; want it to wrap ErrStoreUnavailable", e.Err)
				case tc.logged != "" && !errors.Is(e.Err, provider):
					t.Fatalf("observer: Err %v; want the handler's", e.Err)
				}
			})
		})
	}
}

func ok(_ *sql.Tx, w http.ResponseWriter, _ *http.Request) error {
	w.WriteHeader(http.StatusCreated)
	return nil
}

// errorLines are the lines of a text log logged at error level.
func errorLines(log string) []string {
	var lines []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=ERROR") {
			lines = append(lines, line)
		}
	}
	return lines
}
