package idempotency

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
)

// interruptedPayment leaves the payment with key claimed by an instance
// that died before storing an answer, and returns its keys and the
// fingerprint (hex) of the request that claimed it.
func interruptedPayment(t *testing.T, s *shop, key string) (keys, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
	fp := (&config{}).fingerprint(req, []byte(`{}`), true)
	k := clientKeys(s.idem.cfg.prefix, paymentID(key))
	crashAfterClaim(t, s, k, fp.text())
	return k, hex.EncodeToString(fp[:])
}

// runningPayment claims the payment with key under a lease that outlasts
// the test, as an instance still running its handler does.
func runningPayment(t *testing.T, s *shop, key string) keys {
	t.Helper()
	k := clientKeys(s.idem.cfg.prefix, paymentID(key))
	live := New(s.rdb, WithKeyPrefix(s.idem.cfg.prefix), WithLockLease(time.Minute)).redis
	lock, err := newTestLock()
	require.NoError(t, err)
	c, err := live.claim(t.Context(), k, lock.Value(), "fp")
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, c.outcome)
	return k
}

// seen is what an operator's Inspect of the key named name said a moment
// ago: interrupted, under the claim its record holds now. The scripts must
// still refuse to settle whatever the key has become since.
func seen(t *testing.T, s *shop, name string) keyspace.State {
	t.Helper()
	k, err := keyspace.Parse(s.idem.cfg.prefix, name)
	require.NoError(t, err)
	rec, _ := redistest.ReadRecord(t.Context(), s.rdb, k.Record)
	owner := rec.Owner
	if owner == "" {
		owner = "a-claim-since-gone"
	}
	return keyspace.State{Key: k.Record, State: "run", Interrupted: true, Owner: owner}
}

// A key claimed anew between the operator's look and the settling may be
// running, stalled past its lease: it is left alone.
func TestSettleRefusesAKeyClaimedAnew(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	ctx := t.Context()
	k, _ := interruptedPayment(t, s, "k")
	st, err := s.idem.operated().Inspect(ctx, k.record)
	require.NoError(t, err)
	require.True(t, st.Interrupted)
	require.NoError(t, redistest.EditRecord(ctx, s.rdb, k.record, func(r *keyspace.Record) { r.Owner = "a-new-claim-stalled-past-its-lease" }))
	for _, err := range []error{s.idem.operated().Forget(ctx, st), resolve(ctx, s.idem, st, Answer{Status: 201})} {
		require.ErrorIs(t, err, keyspace.ErrNotInterrupted)
		require.ErrorContains(t, err, "claimed anew")
	}
	require.Equal(t, "run", redistest.RecordState(ctx, s.rdb, k.record))
	st.Interrupted = false
	require.ErrorIs(t, s.idem.operated().Forget(ctx, st), keyspace.ErrNotInterrupted, "a key not seen interrupted")
}

func TestInspect(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	ctx := t.Context()
	c := s.client()

	done := clientKeys(s.idem.cfg.prefix, paymentID("done"))
	first := s.post(c, "/payments", "done", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	for _, name := range []string{done.record, done.lock, done.waiters()} {
		st, err := s.idem.operated().Inspect(ctx, name)
		require.NoError(t, err, name)
		require.Equal(t, done.record, st.Key, "named by %s", name)
		require.Equal(t, "done", st.State)
		require.False(t, st.Interrupted)
		require.Equal(t, http.StatusCreated, st.Status)
		require.EqualValues(t, len(first.body), st.BodySize)
		require.EqualValues(t, 1, st.Executions)
		require.Positive(t, st.Fence)
		require.Len(t, st.Fingerprint, 64)
		require.True(t, st.TTL > 0 && st.TTL <= 24*time.Hour, st.TTL)
		require.Empty(t, st.Lock)
	}

	k, fp := interruptedPayment(t, s, "interrupted")
	st, err := s.idem.operated().Inspect(ctx, k.record)
	require.NoError(t, err)
	require.Equal(t, "run", st.State)
	require.True(t, st.Interrupted)
	require.Equal(t, fp, st.Fingerprint)
	require.NotEmpty(t, st.Owner)
	require.Empty(t, st.Lock)
	require.Zero(t, st.Status)

	// Another program's key where a lock would be reads as no lock, so
	// that it cannot end a walk of every key (Interrupted).
	odd := clientKeys(s.idem.cfg.prefix, paymentID("odd-lock"))
	require.NoError(t, s.rdb.HSet(ctx, odd.lock, "not", "a lock").Err())
	st, err = s.idem.operated().Inspect(ctx, odd.record)
	require.NoError(t, err)
	require.Equal(t, "none", st.State)
	require.Empty(t, st.Lock)

	running := runningPayment(t, s, "running")
	st, err = s.idem.operated().Inspect(ctx, running.lock)
	require.NoError(t, err)
	require.Equal(t, "run", st.State)
	require.False(t, st.Interrupted, "its executor holds the lock")
	require.Equal(t, st.Owner, st.Lock)
	require.True(t, st.LockTTL > 0 && st.LockTTL <= time.Minute, st.LockTTL)

	s.rdb.Set(ctx, running.waiters(), 1, time.Minute)
	st, err = s.idem.operated().Inspect(ctx, running.record)
	require.NoError(t, err)
	require.True(t, st.Waiting)

	none := clientKeys(s.idem.cfg.prefix, paymentID("never"))
	st, err = s.idem.operated().Inspect(ctx, none.record)
	require.NoError(t, err)
	require.Equal(t, keyspace.State{Key: none.record, State: "none"}, st)

	_, err = s.idem.operated().Inspect(ctx, "elsewhere:"+none.record)
	require.ErrorContains(t, err, "names no record")
}

// fakeRecord writes a key-mode record as claim.lua would, under a tag of
// its own, without a request.
func fakeRecord(ctx context.Context, p redis.Cmdable, prefix string, n int, state, owner string) keys {
	k := clientKeys(prefix, identityOf(false, "/fake", fmt.Sprint(n)))
	p.Set(ctx, k.record, keyspace.Record{State: state, Fingerprint: "fp", Owner: owner, Executions: "1",
		Fence: strconv.Itoa(1000 + n)}.String(), time.Hour)
	return k
}

func TestInterrupted(t *testing.T) {
	// Glob characters in the prefix are matched as themselves: keys under
	// base+"x" must not be listed.
	base := "test-interrupted"
	rdb := redistest.Client(t, base)
	s := newShopOn(t, rdb, WithKeyPrefix(base+"[x]*"), WithLockLease(100*time.Millisecond))
	ctx := t.Context()

	var want []string
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// More than a SCAN page, so that the walk takes several steps.
		for i := range 2500 {
			switch {
			case i%1000 == 7:
				want = append(want, fakeRecord(ctx, p, s.idem.cfg.prefix, i, "run", "dead").record)
			case i%1000 == 8: // running: the lock holds the owner's value
				k := fakeRecord(ctx, p, s.idem.cfg.prefix, i, "run", "alive")
				p.Set(ctx, k.lock, "alive", time.Hour)
				p.Set(ctx, k.waiters(), 1, time.Hour)
			case i%1000 == 9: // another prefix that the unescaped glob would match
				fakeRecord(ctx, p, base+"x", i, "run", "dead")
			default:
				k := fakeRecord(ctx, p, s.idem.cfg.prefix, i, "done", "gone")
				p.Set(ctx, k.waiters(), 1, time.Hour)
			}
		}
		return nil
	})
	require.NoError(t, err)
	k, _ := interruptedPayment(t, s, "real")
	want = append(want, k.record)

	var got []string
	for st, err := range s.idem.operated().Interrupted(ctx) {
		require.NoError(t, err)
		require.True(t, st.Interrupted)
		got = append(got, st.Key)
	}
	slices.Sort(got)
	slices.Sort(want)
	require.Equal(t, want, got)

	n := 0
	for range s.idem.operated().Interrupted(ctx) {
		n++
		break
	}
	require.Equal(t, 1, n, "breaking out stops the walk")
}

func TestInterruptedOnCluster(t *testing.T) {
	prefix := "test-interrupted-cluster"
	rdb := redistest.Cluster(t, prefix)
	m := New(rdb, WithKeyPrefix(prefix))
	ctx := t.Context()
	var want []string
	for i := range 60 { // spread over every master
		state := map[bool]string{true: "run", false: "done"}[i%2 == 0]
		k := fakeRecord(ctx, rdb, prefix, i, state, "dead")
		if state == "run" {
			want = append(want, k.record)
		}
	}
	var got []string
	for st, err := range m.operated().Interrupted(ctx) {
		require.NoError(t, err)
		got = append(got, st.Key)
	}
	slices.Sort(got)
	slices.Sort(want)
	require.Equal(t, want, got)
}

func TestResolve(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	ctx := t.Context()
	c := s.client()
	k, fp := interruptedPayment(t, s, "k")
	requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "interrupted")
	before := s.rdb.PTTL(ctx, k.record).Val()

	answer := Answer{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/7"},
			"Set-Cookie": {"flash=created"}, "": {"a name net/http would not send"}, "Bad Name": {"x"}},
		Body:        []byte(`{"payment":7}`),
		Fingerprint: fp,
	}
	bad := answer
	bad.Fingerprint = strings.Repeat("00", 32)
	require.ErrorIs(t, resolve(ctx, s.idem, seen(t, s, k.record), bad), ErrKeyReused)
	bad.Fingerprint = "0011"
	require.ErrorContains(t, resolve(ctx, s.idem, seen(t, s, k.record), bad), "not 32 bytes")
	bad = answer
	bad.Status = 0
	require.ErrorContains(t, resolve(ctx, s.idem, seen(t, s, k.record), bad), "not an HTTP status")
	// A body its Content-Encoding does not describe could never be decoded
	// for a client that does not take that coding: every retry would read
	// 409 unreadable-record for the record's life.
	bad = answer
	bad.Header = http.Header{"Content-Encoding": {"gzip"}}
	require.ErrorContains(t, resolve(ctx, s.idem, seen(t, s, k.record), bad), "not gzip")
	st, err := s.idem.operated().Inspect(ctx, k.record)
	require.NoError(t, err)
	require.True(t, st.Interrupted, "a refused answer changed nothing")

	require.NoError(t, resolve(ctx, s.idem, seen(t, s, k.lock), answer), "named by its lock")
	replay := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, replay.status, replay.body)
	require.Equal(t, `{"payment":7}`, replay.body)
	require.Equal(t, "true", replay.header.Get(ReplayedHeader))
	require.Equal(t, "/payments/7", replay.header.Get("Location"))
	require.Empty(t, replay.header.Get("Set-Cookie"), "stored headers only")
	require.Zero(t, s.execs.Load())
	after := s.rdb.PTTL(ctx, k.record).Val()
	require.True(t, after > 0 && after <= before, "the record keeps its TTL: %v, then %v", before, after)

	err = resolve(ctx, s.idem, seen(t, s, k.record), answer)
	require.ErrorIs(t, err, keyspace.ErrNotInterrupted)
	require.ErrorContains(t, err, "has a stored answer")

	running := runningPayment(t, s, "running")
	err = resolve(ctx, s.idem, seen(t, s, running.record), answer)
	require.ErrorIs(t, err, keyspace.ErrNotInterrupted)
	require.ErrorContains(t, err, "its executor holds the lock")
	require.Equal(t, "run", redistest.RecordState(ctx, s.rdb, running.record))

	none := clientKeys(s.idem.cfg.prefix, paymentID("never"))
	require.ErrorIs(t, resolve(ctx, s.idem, seen(t, s, none.record), answer), keyspace.ErrNotInterrupted)
	require.Zero(t, s.rdb.Exists(ctx, none.record).Val(), "no record is made up")
}

func TestResolveKeepsTheRecordsFingerprint(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	k, _ := interruptedPayment(t, s, "k")
	require.NoError(t, resolve(t.Context(), s.idem, seen(t, s, k.record), Answer{Status: http.StatusAccepted}))
	a := s.post(s.client(), "/payments", "k", `{}`)
	require.Equal(t, http.StatusAccepted, a.status)
	require.Equal(t, "true", a.header.Get(ReplayedHeader))
}

func TestForget(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	ctx := t.Context()
	c := s.client()
	k, _ := interruptedPayment(t, s, "k")
	require.NoError(t, s.idem.operated().Forget(ctx, seen(t, s, k.record)))
	a := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Empty(t, a.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load(), "the retry ran")

	err := s.idem.operated().Forget(ctx, seen(t, s, k.record))
	require.ErrorIs(t, err, keyspace.ErrNotInterrupted)
	require.ErrorContains(t, err, "has a stored answer")
	require.Equal(t, a.body, s.post(c, "/payments", "k", `{}`).body)

	running := runningPayment(t, s, "running")
	require.ErrorIs(t, s.idem.operated().Forget(ctx, seen(t, s, running.record)), keyspace.ErrNotInterrupted)
	require.Equal(t, "run", redistest.RecordState(ctx, s.rdb, running.record))
}

func TestForgetTokenMode(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0)) // a duplicate must reach Redis
	ctx := t.Context()
	c := s.client()
	records := make(chan string, 1)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		e, _ := ExecutionOf(r.Context())
		records <- e.Key
		s.defaultHandler(w, r)
	}
	tok := s.token(c)
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	record := <-records
	// As the instance that ran it would have left it had it died before
	// the store.
	require.NoError(t, redistest.Abandon(ctx, s.rdb, record))
	requireProblem(t, s.post(c, "/orders", tok, `{}`), http.StatusConflict, "interrupted")

	require.NoError(t, s.idem.operated().Forget(ctx, seen(t, s, record+":w")))
	requireProblem(t, s.post(c, "/orders", tok, `{}`), http.StatusUnprocessableEntity, "token-not-found")
	require.EqualValues(t, 1, s.execs.Load())
}

// resolve settles st with a's answer, as admin.Operator.Resolve does.
func resolve(ctx context.Context, m *Middleware, st keyspace.State, a Answer) error {
	return m.operated().Resolve(ctx, st, a.Status, a.Header, a.Body, a.Fingerprint, a.NotReplayable)
}

// A key that holds no record of this layout (a hash, as earlier versions
// stored) reads as unreadable everywhere: its duplicates are refused and
// never run, Inspect reports it corrupt, settling it is refused, and the
// walk over interrupted keys goes past it.
func TestUnreadableRecordLayout(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond), WithResponseCache(0, 0))
	ctx := t.Context()
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "old", `{}`).status)
	old := clientKeys(s.idem.cfg.prefix, paymentID("old"))
	require.NoError(t, s.rdb.Del(ctx, old.record).Err())
	require.NoError(t, s.rdb.HSet(ctx, old.record, "st", "done", "c", "201", "b", "{}").Err())
	require.NoError(t, s.rdb.Expire(ctx, old.record, time.Hour).Err())
	interrupted, _ := interruptedPayment(t, s, "interrupted")

	requireProblem(t, s.post(c, "/payments", "old", `{}`), http.StatusConflict, "unreadable-record")
	st, err := s.idem.operated().Inspect(ctx, old.record)
	require.NoError(t, err)
	require.Equal(t, "corrupt", st.State)
	require.False(t, st.Interrupted)
	st.Interrupted, st.Owner = true, "anyone"
	require.ErrorIs(t, s.idem.operated().Forget(ctx, st), keyspace.ErrNotInterrupted)
	var listed []string
	for st, err := range s.idem.operated().Interrupted(ctx) {
		require.NoError(t, err)
		listed = append(listed, st.Key)
	}
	require.Equal(t, []string{interrupted.record}, listed)
	require.EqualValues(t, 1, s.execs.Load())
}
