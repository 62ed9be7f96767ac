package sqlstoretest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// A handler whose transaction's connection the database ends (a backend
// terminated, a connection killed, a server restarting) committed
// nothing: its request is answered as a database that does not answer
// is, 503 store-unavailable with Retry-After, not as the handler's own
// failure, and the key is free, so that the retry runs once and commits.
func TestAHandlersEndedConnectionIsStoreUnavailable(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		ctx := context.Background()
		effects, outcomes := effectsTable(t, d), outcomeStore(t, d)
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_ended")),
			idempotency.WithSharedKeys(), idempotency.WithOutcomeStore(outcomes))
		var runs, cut atomic.Int32
		srv := httptest.NewServer(m.ProtectKey(outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
			runs.Add(1)
			if cut.Add(1) == 1 {
				var id int64
				if err := tx.QueryRowContext(r.Context(), ownConnectionID[d.Kind]).Scan(&id); err != nil {
					return err
				}
				kill(t, d, id)
			}
			if _, err := tx.ExecContext(r.Context(), d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"),
				r.Header.Get("Idempotency-Key")); err != nil {
				return fmt.Errorf("paying: %w", err)
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
			return nil
		})))
		t.Cleanup(srv.Close)

		send := func() (*http.Response, string) {
			resp, body := postRead(t, srv, "ended-1")
			return resp, string(body)
		}
		resp, body := send()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		var problem struct{ Type, Detail string }
		require.NoError(t, json.Unmarshal([]byte(body), &problem))
		require.True(t, strings.HasSuffix(problem.Type, "store-unavailable"), body)
		require.NotContains(t, body, "paying", "the handler's error text stays on the server")

		resp, body = send()
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		resp, body = send()
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		require.Equal(t, "paid", body)
		require.EqualValues(t, 2, runs.Load(), "the first run committed nothing; the retry ran once")
		var paid int
		require.NoError(t, d.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+effects).Scan(&paid))
		require.Equal(t, 1, paid)
	})
}

// A transaction that begins on a pooled connection the server ended while
// it sat idle goes on with another, as database/sql's own BeginTx does:
// the request runs once, it is not refused 503.
func TestAHandlerMovesPastAKilledIdleConnection(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		db := openPool(t, d, 8, "")
		db.SetMaxIdleConns(8)
		outcomes, err := sqlidem.New(db, d.Dialect, sqlidem.WithTable(d.Table(t, "idem_outcomes")))
		require.NoError(t, err)
		require.NoError(t, outcomes.CreateTable(context.Background()))
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_idlekilled")),
			idempotency.WithSharedKeys(), idempotency.WithOutcomeStore(outcomes))
		var runs atomic.Int32
		srv := httptest.NewServer(m.ProtectKey(outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			return nil
		})))
		t.Cleanup(srv.Close)
		require.Equal(t, http.StatusCreated, post(t, srv, "before").StatusCode)

		ids := killIdle(t, db, d)
		for i := range 3 {
			resp := post(t, srv, fmt.Sprint("after-", i))
			require.Equal(t, http.StatusCreated, resp.StatusCode, "killed connections: %d", len(ids))
		}
		require.EqualValues(t, 4, runs.Load())
	})
}

// A handler that fails for a reason of its own keeps its own answer, also
// when its connection went with it: it gave up on a statement of its own
// (its own timeout, whose cancelled statement the driver answers by
// closing the connection), whether it passes that error on or answers
// with one of its own; or a connection of its own (dblink, a foreign
// table) reported a connection's SQLSTATE, which the database relays at
// ERROR, not as the end of this session. The request is not told to retry
// as if the database were down.
func TestAHandlersOwnFailureIsItsOwnAnswer(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		outcomes := outcomeStore(t, d)
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(d.Table(t, "idem_ownfailure")),
			idempotency.WithSharedKeys(), idempotency.WithOutcomeStore(outcomes))
		sleep := map[sqltest.Kind]string{sqltest.PostgreSQL: "SELECT pg_sleep(2)", sqltest.MySQL: "SELECT SLEEP(2)"}
		relayed := map[sqltest.Kind]string{
			sqltest.PostgreSQL: "DO $$ BEGIN RAISE EXCEPTION 'remote is down' USING ERRCODE = '08001'; END $$",
			sqltest.MySQL:      "SIGNAL SQLSTATE '08001' SET MESSAGE_TEXT = 'remote is down'",
		}
		terminated := "DO $$ BEGIN RAISE EXCEPTION 'remote backend ended' USING ERRCODE = '57P01'; END $$"
		for _, tc := range []struct {
			name   string
			status int
			fail   func(ctx context.Context, tx *sql.Tx) error
		}{
			{"own timeout, passed on", http.StatusGatewayTimeout, func(ctx context.Context, tx *sql.Tx) error {
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				_, err := tx.ExecContext(ctx, sleep[d.Kind])
				return fmt.Errorf("rates: %w", err)
			}},
			{"own timeout, answered as its own", http.StatusUnprocessableEntity, func(ctx context.Context, tx *sql.Tx) error {
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				if _, err := tx.ExecContext(ctx, sleep[d.Kind]); err != nil {
					return errors.New("could not verify the card")
				}
				return nil
			}},
			{"a connection's SQLSTATE, relayed", http.StatusBadGateway, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, relayed[d.Kind])
				return fmt.Errorf("remote: %w", err)
			}},
			{"another database refuses a connection", http.StatusBadGateway, func(ctx context.Context, tx *sql.Tx) error {
				// PostgreSQL refuses at FATAL, as it ends a session.
				other, err := sql.Open(d.Driver, strings.Replace(d.DSN, "/test", "/no_such_database_idem", 1))
				if err != nil {
					return err
				}
				defer other.Close()
				return fmt.Errorf("ledger replica: %w", other.PingContext(ctx))
			}},
			{"a terminated backend's SQLSTATE, relayed", http.StatusBadGateway, func(ctx context.Context, tx *sql.Tx) error {
				if d.Kind != sqltest.PostgreSQL {
					return errors.New("remote backend ended")
				}
				_, err := tx.ExecContext(ctx, terminated)
				return fmt.Errorf("remote: %w", err)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				srv := httptest.NewServer(m.ProtectKey(outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
					if err := tc.fail(r.Context(), tx); err != nil {
						w.WriteHeader(tc.status)
						io.WriteString(w, "the handler's own answer")
						return err
					}
					w.WriteHeader(http.StatusCreated)
					return nil
				})))
				t.Cleanup(srv.Close)
				resp, body := postRead(t, srv, "own-"+tc.name)
				require.Equal(t, tc.status, resp.StatusCode, string(body))
				require.Equal(t, "the handler's own answer", string(body))
				require.Empty(t, resp.Header.Get("Retry-After"))
			})
		}
	})
}
