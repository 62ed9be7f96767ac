package sqlstoretest

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// With sqlidem on the database that keeps the keys, the key's answer
// commits in the handler's transaction, with its writes and the outcome
// row: once the handler's COMMIT returned, before the middleware did
// anything more, the key's record is the answer (a retry replays it, on
// any instance, once the lease lapses, even if this process died then),
// and its lease is still held, also after a journaled step. A duplicate
// meanwhile waits, and gets what the middleware sent, as does every
// later one.
func TestAnswerCommitsWithTheHandlersWrites(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for _, steps := range []bool{false, true} {
			t.Run(map[bool]string{false: "claim", true: "journaled"}[steps], func(t *testing.T) { answerCommits(t, d, steps) })
		}
	})
}

// answerCommits is one case of TestAnswerCommitsWithTheHandlersWrites:
// with steps, the run journals one before its transaction.
func answerCommits(t *testing.T, d *sqltest.DB, steps bool) {
	ctx := context.Background()
	keysTable, effects := d.Table(t, "idem_onetx"), effectsTable(t, d)
	outcomes := outcomeStore(t, d)
	m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(keysTable), idempotency.WithSharedKeys(),
		idempotency.WithOutcomeStore(outcomes), idempotency.WithResume())
	pay := outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
		_, err := tx.ExecContext(r.Context(), d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"),
			r.Header.Get("Idempotency-Key"))
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
		return nil
	})
	other := httptest.NewServer(idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(keysTable),
		idempotency.WithSharedKeys()).ProtectKey(http.NotFoundHandler()))
	t.Cleanup(other.Close)
	var afterCommit atomic.Value
	inGap := make(chan answerSeen, 1)
	srv := httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A layer between the middleware and the transaction, which adds
		// a header before it and text after it: what it adds is sent, so
		// it is replayed too.
		w.Header().Set("X-Layer", "outer")
		if steps {
			// A journaled step first: the record is no longer the claim as
			// it was written. (Before the transaction: on SQLite, whose
			// transaction locks the file, the journal could not be written
			// during it.)
			_, err := idempotency.Step(r.Context(), "reserve", func(context.Context) (string, error) {
				return "reserved", nil
			})
			require.NoError(t, err)
		}
		pay.ServeHTTP(w, r)
		// Committed; the middleware has not stored anything yet. A
		// duplicate now, on another instance, waits for the answer sent.
		afterCommit.Store(keyRow(t, d, keysTable))
		go func() { inGap <- seen(t, other, "k") }()
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, " +layer")
	})))
	t.Cleanup(srv.Close)

	first := seen(t, srv, "k")
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "paid +layer", first.body)
	row := afterCommit.Load().(row)
	require.True(t, strings.HasPrefix(row.record, "done "), "the answer is the key's at COMMIT: %q", row.record)
	require.NotEmpty(t, row.holder, "the lease is still held until the middleware lets it go")

	row = keyRow(t, d, keysTable)
	require.True(t, strings.HasPrefix(row.record, "done "), row.record)
	require.Empty(t, row.holder, "the middleware let the lease go")
	for _, replay := range []answerSeen{<-inGap, seen(t, other, "k")} {
		require.Equal(t, http.StatusCreated, replay.status)
		require.Equal(t, "true", replay.replayed)
		require.Equal(t, "outer", replay.layer, "what the middleware sent is what replays")
		require.Equal(t, first.body, replay.body, "what the middleware sent is what replays")
	}
	var n int
	require.NoError(t, d.QueryRowContext(ctx, "SELECT count(*) FROM "+effects).Scan(&n))
	require.Equal(t, 1, n)
}

// A run whose key another executor owns by the time it commits (taken
// over, or settled by an operator) commits nothing: its writes roll back
// with the answer it cannot store, and it is answered in-progress. (On
// SQLite the handler's transaction locks the whole file: nobody takes a
// key over meanwhile.)
func TestAnswerOfAKeyNoLongerOursRollsBack(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		ctx := context.Background()
		keysTable, effects := d.Table(t, "idem_onetx"), effectsTable(t, d)
		outcomes := outcomeStore(t, d)
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(keysTable), idempotency.WithSharedKeys(),
			idempotency.WithOutcomeStore(outcomes))
		pay := outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
			// Meanwhile, another executor took the key (its record names
			// another owner), outside this transaction.
			taken := keyRow(t, d, keysTable)
			rec, ok := keyspace.ParseRecord(taken.record)
			require.True(t, ok, taken.record)
			_, line, _ := strings.Cut(taken.record, "\n")
			rec.Owner = "another-executor"
			_, err := d.ExecContext(r.Context(), d.Dialect.Bind("UPDATE "+keysTable+" SET record = ?"),
				[]byte(rec.String()+line))
			require.NoError(t, err)
			if _, err := tx.ExecContext(r.Context(), d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"), "k"); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		srv := httptest.NewServer(m.ProtectKey(pay))
		t.Cleanup(srv.Close)

		resp := post(t, srv, "k")
		require.Equal(t, http.StatusConflict, resp.StatusCode)
		var n int
		require.NoError(t, d.QueryRowContext(ctx, "SELECT count(*) FROM "+effects).Scan(&n))
		require.Zero(t, n, "the writes rolled back")
		_, found, err := outcomes.Lookup(ctx, keyRow(t, d, keysTable).id)
		require.NoError(t, err)
		require.False(t, found, "no outcome committed")
	})
}

// effectsTable is a table of d that handlers write their effects to, one
// row per key.
func effectsTable(t *testing.T, d *sqltest.DB) string {
	table := d.Table(t, "onetx_payments")
	_, err := d.ExecContext(context.Background(), "CREATE TABLE "+table+" (k VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	return table
}

// outcomeStore is a sqlidem store on d, in a table of its own.
func outcomeStore(t *testing.T, d *sqltest.DB) *sqlidem.Store {
	s, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(d.Table(t, "idem_outcomes")))
	require.NoError(t, err)
	require.NoError(t, s.CreateTable(context.Background()))
	return s
}

type row struct{ id, record, holder string }

// keyRow reads the one key's row of table.
func keyRow(t *testing.T, d *sqltest.DB, table string) row {
	var r row
	var record []byte
	require.NoError(t, d.QueryRowContext(context.Background(), "SELECT id, record, holder FROM "+table).
		Scan(&r.id, &record, &r.holder))
	r.record = string(record)
	return r
}

// A transaction above READ COMMITTED sees the key's row change under it
// (the lease is renewed every third of a lease while the handler runs):
// the key's answer is then stored after the commit, and the transaction
// is not aborted over it (on PostgreSQL it would be, every time).
func TestAnswerAboveReadCommittedCommitsOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		ctx := context.Background()
		keysTable, effects := d.Table(t, "idem_iso"), effectsTable(t, d)
		for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			s, err := sqlidem.New(d.DB, d.Dialect, sqlidem.WithTable(d.Table(t, "idem_iso_outcomes")),
				sqlidem.WithIsolation(level))
			require.NoError(t, err)
			require.NoError(t, s.CreateTable(ctx))
			m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(keysTable), idempotency.WithSharedKeys(),
				idempotency.WithOutcomeStore(s), idempotency.WithLockLease(300*time.Millisecond))
			var runs atomic.Int32
			srv := httptest.NewServer(m.ProtectKey(s.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
				runs.Add(1)
				if _, err := tx.ExecContext(r.Context(), d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"),
					r.Header.Get("Idempotency-Key")); err != nil {
					return err
				}
				time.Sleep(400 * time.Millisecond) // past a renewal
				w.WriteHeader(http.StatusCreated)
				return nil
			})))
			key := level.String()
			resp := post(t, srv, key)
			srv.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode, "%v", level)
			require.LessOrEqual(t, runs.Load(), int32(2), "%v: at most one attempt aborted over the key's row", level)
			var n int
			require.NoError(t, d.QueryRowContext(ctx, d.Dialect.Bind("SELECT count(*) FROM "+effects+" WHERE k = ?"), key).Scan(&n))
			require.Equal(t, 1, n, "%v", level)
		}
	})
}

// answerSeen is what a client saw of an answer.
type answerSeen struct {
	status                int
	body, replayed, layer string
}

// seen posts key to srv and returns what came back.
func seen(t *testing.T, srv *httptest.Server, key string) answerSeen {
	resp, body := postRead(t, srv, key)
	return answerSeen{status: resp.StatusCode, body: string(body), replayed: resp.Header.Get(idempotency.ReplayedHeader),
		layer: resp.Header.Get("X-Layer")}
}

// A function that Do runs commits the key's answer in sqlidem.Run's
// transaction too: once Run's COMMIT returned, before Do stored anything,
// the key's record is the function's result, its lease still held; Do
// then lets the lease go, and a redelivery gets the result without
// running the function.
func TestDoAnswerCommitsWithTheFunctionsWrites(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		ctx := context.Background()
		keysTable, effects := d.Table(t, "idem_onetx_do"), effectsTable(t, d)
		outcomes := outcomeStore(t, d)
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(keysTable), idempotency.WithSharedKeys(),
			idempotency.WithOutcomeStore(outcomes))
		var runs atomic.Int32
		var afterCommit row
		pay := func(ctx context.Context) (string, error) {
			runs.Add(1)
			v, err := sqlidem.Run(ctx, outcomes, func(ctx context.Context, tx *sql.Tx) (string, error) {
				_, err := tx.ExecContext(ctx, d.Dialect.Bind("INSERT INTO "+effects+" (k) VALUES (?)"), "msg-1")
				return "paid", err
			})
			afterCommit = keyRow(t, d, keysTable)
			return v, err
		}
		key := idempotency.Key{Scope: "queue", ID: "msg-1"}
		v, err := idempotency.Do(ctx, m, key, pay)
		require.NoError(t, err)
		require.Equal(t, "paid", v)
		require.True(t, strings.HasPrefix(afterCommit.record, "done "), "the result is the key's at COMMIT: %q", afterCommit.record)
		require.NotEmpty(t, afterCommit.holder, "the lease is still held until Do lets it go")

		after := keyRow(t, d, keysTable)
		require.True(t, strings.HasPrefix(after.record, "done "), after.record)
		require.Empty(t, after.holder, "Do let the lease go")
		v, err = idempotency.Do(ctx, m, key, pay) // a redelivery
		require.NoError(t, err)
		require.Equal(t, "paid", v)
		require.EqualValues(t, 1, runs.Load())
		var n int
		require.NoError(t, d.QueryRowContext(ctx, "SELECT count(*) FROM "+effects).Scan(&n))
		require.Equal(t, 1, n)
	})
}
