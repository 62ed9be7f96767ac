package sqlstoretest

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// payments is a key-mode payment route on SQL whose handler can be made to
// run past its execution timeout and give up, which leaves its key
// interrupted, and the operator of its keys.
type payments struct {
	srv  *httptest.Server
	ops  *admin.Operator
	runs atomic.Int32
	hang atomic.Bool
	keys sync.Map // Execution.Key (the record's name) by Idempotency-Key
}

func newPayments(t *testing.T, d *sqltest.DB, table, prefix string, opts ...idempotency.Option) *payments {
	m := idempotency.NewSQL(d.DB, d.Dialect, append([]idempotency.Option{idempotency.WithSQLTable(table),
		idempotency.WithKeyPrefix(prefix), idempotency.WithSharedKeys(), idempotency.WithResponseCache(0, 0),
		idempotency.WithExecutionTimeout(300 * time.Millisecond),
		idempotency.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	p := &payments{ops: admin.New(m)}
	p.srv = httptest.NewServer(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.runs.Add(1)
		if e, ok := idempotency.ExecutionOf(r.Context()); ok {
			p.keys.Store(r.Header.Get(idempotency.KeyHeader), e.Key)
		}
		if p.hang.Load() {
			// Cut off by the execution timeout, it returns without an
			// answer: not a success, so the key is kept.
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ran")
	})))
	t.Cleanup(p.srv.Close)
	return p
}

type answer struct {
	status   int
	body     string
	replayed bool
}

func (p *payments) post(t *testing.T, key string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	req.Header.Set(idempotency.KeyHeader, key)
	resp, err := p.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, string(body), resp.Header.Get(idempotency.ReplayedHeader) == "true"}
}

// interrupt sends key to a handler that runs past its execution timeout
// and gives up, so that the key is kept claimed with no executor.
func (p *payments) interrupt(t *testing.T, key string) {
	t.Helper()
	p.hang.Store(true)
	defer p.hang.Store(false)
	p.post(t, key)
}

// record is the name of key's record, as the middleware logs it.
func (p *payments) record(t *testing.T, key string) string {
	t.Helper()
	name, ok := p.keys.Load(key)
	require.True(t, ok, "no execution of %q", key)
	return name.(string)
}

// interrupted lists the interrupted keys, by record name.
func (p *payments) interrupted(t *testing.T) map[string]admin.KeyState {
	t.Helper()
	found := map[string]admin.KeyState{}
	for st, err := range p.ops.Interrupted(t.Context()) {
		require.NoError(t, err)
		require.NotContains(t, found, st.Key, "yielded twice")
		found[st.Key] = st
	}
	return found
}

func (p *payments) inspect(t *testing.T, name string) admin.KeyState {
	t.Helper()
	st, err := p.ops.Inspect(t.Context(), name)
	require.NoError(t, err)
	return st
}

// The operator's API on SQL: it finds keys left interrupted, settles one
// with an answer that retries replay and another by forgetting it, so that
// a retry runs again, and refuses to settle whatever is no longer
// interrupted by the claim it saw, as on Redis.
func TestOperatorOnSQL(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_ops")
		p := newPayments(t, d, table, "ops")
		// Another middleware's keys in the same table, under another
		// prefix (one that SQLite's LIKE, blind to case, would match).
		other := newPayments(t, d, table, "OPS")
		other.interrupt(t, "resolved")

		p.interrupt(t, "resolved")
		p.interrupt(t, "forgotten")
		require.EqualValues(t, 2, p.runs.Load())
		require.Equal(t, http.StatusConflict, p.post(t, "resolved").status, "an interrupted key's retry")
		require.EqualValues(t, 2, p.runs.Load())

		found := p.interrupted(t)
		require.Len(t, found, 2, "this prefix's two keys, not the other's")
		require.Len(t, other.interrupted(t), 1)
		for key, st := range found {
			require.True(t, strings.HasPrefix(key, "ops:{k"), key)
			require.Equal(t, "run", st.State)
			require.True(t, st.Interrupted)
			require.Empty(t, st.Lock, "nobody holds the key")
			require.NotEmpty(t, st.Owner)
			require.Len(t, st.Fingerprint, 64)
			require.EqualValues(t, 1, st.Executions)
			require.NotZero(t, st.Fence)
			require.Greater(t, st.TTL, time.Hour)
			require.False(t, st.Waiting)
			// Inspect reads it the same by its record's name and its
			// lock's, and the fence is the database's clock.
			sameState(t, st, p.inspect(t, key))
			sameState(t, st, p.inspect(t, strings.TrimSuffix(key, "r")+"l"))
			require.WithinDuration(t, time.Now(), time.UnixMicro(int64(st.Fence)), time.Minute)
		}
		resolved, forgotten := found[p.record(t, "resolved")], found[p.record(t, "forgotten")]

		settled := idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")}
		require.NoError(t, p.ops.Resolve(t.Context(), resolved, settled))
		require.NoError(t, p.ops.Resolve(t.Context(), resolved, settled), "the same Resolve again finds its work done")
		require.NoError(t, p.ops.Forget(t.Context(), forgotten))
		require.NoError(t, p.ops.Forget(t.Context(), forgotten), "the same Forget again finds its work done")
		require.Empty(t, p.interrupted(t))
		require.Len(t, other.interrupted(t), 1, "the other prefix's key is untouched")

		now := p.inspect(t, resolved.Key)
		require.Equal(t, "done", now.State)
		require.False(t, now.Interrupted)
		require.Equal(t, http.StatusAccepted, now.Status)
		require.EqualValues(t, 7, now.BodySize)
		require.Equal(t, resolved.Fence, now.Fence, "the fence stays")
		require.Empty(t, now.Owner, "the executor goes")
		require.InDelta(t, resolved.TTL, now.TTL, float64(time.Minute), "the record keeps its TTL")
		for _, err := range []error{
			p.ops.Forget(t.Context(), resolved),
			p.ops.Resolve(t.Context(), resolved, idempotency.Answer{Status: http.StatusOK, Body: []byte("other")}),
		} {
			require.ErrorIs(t, err, admin.ErrNotInterrupted)
			require.ErrorContains(t, err, "has a stored answer")
		}
		for range 2 {
			a := p.post(t, "resolved")
			require.Equal(t, answer{http.StatusAccepted, "settled", true}, a, "retries replay the resolved answer")
		}
		require.EqualValues(t, 2, p.runs.Load(), "without running the handler")

		require.Equal(t, "none", p.inspect(t, forgotten.Key).State)
		err := p.ops.Resolve(t.Context(), forgotten, settled)
		require.ErrorIs(t, err, admin.ErrNotInterrupted)
		require.ErrorContains(t, err, "forgotten")
		require.Equal(t, answer{http.StatusCreated, "ran", false}, p.post(t, "forgotten"), "the forgotten key's retry runs again")
		require.EqualValues(t, 3, p.runs.Load())
		require.ErrorIs(t, p.ops.Forget(t.Context(), forgotten), admin.ErrNotInterrupted)
	})
}

// A key claimed anew after the operator looked, a key whose executor holds
// it, and an answer that is another request's are refused, and change
// nothing.
func TestOperatorOnSQLRefuses(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_ops")
		p := newPayments(t, d, table, "ops")
		settled := idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")}

		p.interrupt(t, "again")
		old := single(t, p.interrupted(t))
		require.NoError(t, p.ops.Forget(t.Context(), old))
		p.interrupt(t, "again") // a retry claims it anew, and gives up too
		now := single(t, p.interrupted(t))
		require.NotEqual(t, old.Owner, now.Owner)
		for _, err := range []error{p.ops.Resolve(t.Context(), old, settled), p.ops.Forget(t.Context(), old)} {
			require.ErrorIs(t, err, admin.ErrNotInterrupted)
			require.ErrorContains(t, err, "claimed anew")
		}

		err := p.ops.Resolve(t.Context(), now, idempotency.Answer{Status: http.StatusAccepted,
			Fingerprint: strings.Repeat("0", 64)})
		require.ErrorIs(t, err, idempotency.ErrKeyReused)
		sameState(t, now, p.inspect(t, now.Key))
		require.NoError(t, p.ops.Resolve(t.Context(), now, idempotency.Answer{Status: http.StatusAccepted,
			Fingerprint: now.Fingerprint, Body: []byte("settled")}))
		require.Equal(t, answer{http.StatusAccepted, "settled", true}, p.post(t, "again"))

		// A run in progress: its executor holds the key.
		entered, release := make(chan string, 1), make(chan struct{})
		slow := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithKeyPrefix("ops"),
			idempotency.WithSharedKeys(), idempotency.WithLogger(slog.New(slog.DiscardHandler)))
		srv := httptest.NewServer(slow.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e, _ := idempotency.ExecutionOf(r.Context())
			entered <- e.Key
			<-release
			w.WriteHeader(http.StatusCreated)
		})))
		defer srv.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
			req.Header.Set(idempotency.KeyHeader, "running")
			if resp, err := srv.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		record := <-entered
		require.Empty(t, p.interrupted(t))
		running := p.inspect(t, record)
		require.Equal(t, "run", running.State)
		require.False(t, running.Interrupted)
		require.Equal(t, running.Owner, running.Lock)
		require.Positive(t, running.LockTTL)
		running.Interrupted = true // as an operator who looked a moment before might have seen it
		err = p.ops.Forget(t.Context(), running)
		require.ErrorIs(t, err, admin.ErrNotInterrupted)
		require.ErrorContains(t, err, "running")
		close(release)
		<-done
		require.Equal(t, "done", p.inspect(t, running.Key).State)
	})
}

func single(t *testing.T, found map[string]admin.KeyState) admin.KeyState {
	t.Helper()
	require.Len(t, found, 1)
	for _, st := range found {
		return st
	}
	return admin.KeyState{}
}

// sameState checks that two reads of a key agree, but for the time that
// passed between them.
func sameState(t *testing.T, want, got admin.KeyState) {
	t.Helper()
	require.InDelta(t, want.TTL, got.TTL, float64(time.Minute))
	want.TTL, got.TTL = 0, 0
	require.Equal(t, want, got)
}

// Interrupted walks the whole table a page at a time: every interrupted
// key under the prefix once, none of another prefix's, none finished.
func TestOperatorOnSQLWalksEveryPage(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "idem_walk")
		m := idempotency.NewSQL(d.DB, d.Dialect, idempotency.WithSQLTable(table), idempotency.WithKeyPrefix("walk"),
			idempotency.WithSharedKeys())
		require.NoError(t, m.Ready(t.Context()), "the table exists")
		insert := "INSERT INTO " + table + " (id, record, record_until) VALUES (?, ?, ?)"
		if d.Kind == sqltest.PostgreSQL {
			insert = "INSERT INTO " + table + " (id, record, record_until) VALUES ($1, $2, $3)"
		}
		until := time.Now().Add(time.Hour).UnixMicro()
		kept := keyspace.Record{State: "run", Fingerprint: "ab", Owner: "!gone", Fence: "1", Executions: "1"}.String()
		finished := keyspace.Record{State: "done", Fingerprint: "ab", Fence: "1", Executions: "1",
			Status: "201", Body: strings.Repeat("x", 2000)}.String()
		want := map[string]bool{}
		tx, err := d.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		for i := range 2100 {
			id := fmt.Sprintf("walk:{k%05d}:r", i)
			rec := kept
			switch {
			case i%3 == 2:
				rec = finished
			case i%7 == 0:
				id = fmt.Sprintf("walks:{k%05d}:r", i) // another prefix
			default:
				want[id] = true
			}
			_, err := tx.ExecContext(t.Context(), insert, id, []byte(rec), until)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		require.Greater(t, len(want), 1000)

		got := map[string]bool{}
		for st, err := range admin.New(m).Interrupted(t.Context()) {
			require.NoError(t, err)
			require.False(t, got[st.Key], "%s yielded twice", st.Key)
			require.True(t, st.Interrupted)
			got[st.Key] = true
		}
		require.Equal(t, want, got)
	})
}
