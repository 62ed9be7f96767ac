package admin_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// interrupt leaves the payment with key interrupted, as a reverse proxy
// whose upstream died mid-body does: its handler panicked after its status
// went out, so the key is kept and no answer is stored.
func interrupt(t *testing.T, h http.Handler, key string) {
	t.Helper()
	defer func() { require.NotNil(t, recover(), "the panic goes on to the recoverer") }()
	h.ServeHTTP(httptest.NewRecorder(), payment(key))
}

func payment(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":5}`))
	r.Header.Set(idempotency.KeyHeader, key)
	return r
}

// The operator finds the interrupted keys, and settles one with its answer
// and another by forgetting it: the first is replayed, the second runs
// again, and neither is interrupted any more.
func TestOperatorSettlesInterruptedKeys(t *testing.T) {
	const prefix = "test-admin"
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	var crash bool
	h := idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		if crash {
			panic("upstream died mid-body")
		}
		w.Write([]byte("ran"))
	}))
	crash = true
	interrupt(t, h, "resolved")
	interrupt(t, h, "forgotten")
	crash = false
	ops := admin.New(idem)

	var interrupted []admin.KeyState
	for st, err := range ops.Interrupted(t.Context()) {
		require.NoError(t, err)
		interrupted = append(interrupted, st)
	}
	require.Len(t, interrupted, 2)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, payment("resolved"))
	require.Equal(t, http.StatusConflict, w.Code, "interrupted")

	var resolved, forgotten admin.KeyState
	for _, st := range interrupted {
		require.Equal(t, "run", st.State)
		again, err := ops.Inspect(t.Context(), st.Key)
		require.NoError(t, err)
		require.Equal(t, st.Key, again.Key)
		if resolved.Key == "" {
			resolved = st
		} else {
			forgotten = st
		}
	}
	require.NoError(t, ops.Resolve(t.Context(), resolved, idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")}))
	require.NoError(t, ops.Forget(t.Context(), forgotten))
	now, err := ops.Inspect(t.Context(), resolved.Key)
	require.NoError(t, err)
	require.Equal(t, "done", now.State)
	require.ErrorIs(t, ops.Forget(t.Context(), now), admin.ErrNotInterrupted, "a stored answer is not forgotten")

	answers := map[string]int{}
	for _, key := range []string{"resolved", "forgotten"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, payment(key))
		answers[w.Body.String()] = w.Code
	}
	require.Equal(t, map[string]int{"settled": http.StatusAccepted, "ran": http.StatusCreated}, answers,
		"one key replays the operator's answer, the other runs again")
	for _, err := range ops.Interrupted(t.Context()) {
		require.NoError(t, err)
		t.Fatal("no key is interrupted any more")
	}
}

// payments is a protected payment route whose handler can be made to die
// mid-answer, and the operator of its keys.
type payments struct {
	h     http.Handler
	ops   *admin.Operator
	runs  atomic.Int32
	crash atomic.Bool
}

func newPayments(t *testing.T, prefix string) *payments {
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	p := &payments{ops: admin.New(idem)}
	p.h = idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		if p.crash.Load() {
			panic("upstream died mid-body")
		}
		w.Write([]byte("ran"))
	}))
	return p
}

// interrupted leaves key interrupted and returns the state the operator
// reads of it.
func (p *payments) interrupted(t *testing.T, key string) admin.KeyState {
	t.Helper()
	p.crash.Store(true)
	interrupt(t, p.h, key)
	p.crash.Store(false)
	return p.inspect(t, key)
}

// inspect reads the record of key as it is now.
func (p *payments) inspect(t *testing.T, key string) admin.KeyState {
	t.Helper()
	var found []admin.KeyState
	for st, err := range p.ops.Interrupted(t.Context()) {
		require.NoError(t, err)
		found = append(found, st)
	}
	require.Len(t, found, 1, "one interrupted key")
	return found[0]
}

// retry sends the payment with key again and returns its answer.
func (p *payments) retry(key string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, payment(key))
	return w
}

// A Resolve after the key was forgotten stores nothing, so it must not
// report success: the retry runs the handler, as Forget promised.
func TestResolveAfterForgetIsRefused(t *testing.T) {
	p := newPayments(t, "test-admin-resolve-forgotten")
	st := p.interrupted(t, "k")
	require.NoError(t, p.ops.Forget(t.Context(), st))

	err := p.ops.Resolve(t.Context(), st, idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")})
	require.ErrorIs(t, err, admin.ErrNotInterrupted)
	require.ErrorContains(t, err, "forgotten")
	now, err := p.ops.Inspect(t.Context(), st.Key)
	require.NoError(t, err)
	require.Equal(t, "none", now.State, "the record stays forgotten")

	w := p.retry("k")
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, "ran", w.Body.String(), "the retry runs again")
	require.Equal(t, int32(2), p.runs.Load())
}

// A forgotten key that a retry claims anew keeps what the operator's
// Forget left in its record. Settling it with the state read before the
// Forget is refused, whether the retry stored its answer or died in turn;
// the state read after the retry's claim settles it.
func TestSettlingAKeyClaimedAgainAfterForgetIsRefused(t *testing.T) {
	p := newPayments(t, "test-admin-reclaimed")
	answer := idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")}
	old := p.interrupted(t, "answered")
	require.NoError(t, p.ops.Forget(t.Context(), old))
	require.Equal(t, http.StatusCreated, p.retry("answered").Code, "the retry claims the key and answers")
	for _, err := range []error{p.ops.Resolve(t.Context(), old, answer), p.ops.Forget(t.Context(), old)} {
		require.ErrorIs(t, err, admin.ErrNotInterrupted)
		require.ErrorContains(t, err, "has a stored answer")
	}
	w := p.retry("answered")
	require.Equal(t, "ran", w.Body.String(), "the retry's answer stays the key's")
	require.Equal(t, "true", w.Header().Get(idempotency.ReplayedHeader))

	old = p.interrupted(t, "died")
	require.NoError(t, p.ops.Forget(t.Context(), old))
	p.crash.Store(true)
	interrupt(t, p.h, "died") // the retry claims the key, and dies too
	p.crash.Store(false)
	for _, err := range []error{p.ops.Resolve(t.Context(), old, answer), p.ops.Forget(t.Context(), old)} {
		require.ErrorIs(t, err, admin.ErrNotInterrupted)
		require.ErrorContains(t, err, "claimed anew")
	}
	now := p.inspect(t, "died")
	require.NotEqual(t, old.Owner, now.Owner)
	require.NoError(t, p.ops.Resolve(t.Context(), now, answer), "the retry's claim is interrupted")
	require.Equal(t, "settled", p.retry("died").Body.String())
}

// A Forget after the key was resolved deletes nothing, so it must not
// report success: the key replays the resolved answer.
func TestForgetAfterResolveIsRefused(t *testing.T) {
	p := newPayments(t, "test-admin-forget-resolved")
	st := p.interrupted(t, "k")
	require.NoError(t, p.ops.Resolve(t.Context(), st, idempotency.Answer{Status: http.StatusAccepted, Body: []byte("settled")}))

	err := p.ops.Forget(t.Context(), st)
	require.ErrorIs(t, err, admin.ErrNotInterrupted)
	require.ErrorContains(t, err, "has a stored answer")
	w := p.retry("k")
	require.Equal(t, http.StatusAccepted, w.Code)
	require.Equal(t, "settled", w.Body.String())
	require.Equal(t, int32(1), p.runs.Load(), "only the interrupted run")
}

// Of two Resolves of one interrupted key with different answers, the
// first settles it and the second is refused: the key replays the first.
func TestSecondResolveWithAnotherAnswerIsRefused(t *testing.T) {
	p := newPayments(t, "test-admin-resolve-twice")
	st := p.interrupted(t, "k")
	first := idempotency.Answer{Status: http.StatusAccepted, Body: []byte("first")}
	require.NoError(t, p.ops.Resolve(t.Context(), st, first))
	for name, second := range map[string]idempotency.Answer{
		"body":   {Status: http.StatusAccepted, Body: []byte("second")},
		"status": {Status: http.StatusOK, Body: []byte("first")},
		"header": {Status: http.StatusAccepted, Body: []byte("first"), Header: http.Header{"Location": {"/payments/2"}}},
		"state":  {Status: http.StatusAccepted, Body: []byte("first"), NotReplayable: true},
	} {
		err := p.ops.Resolve(t.Context(), st, second)
		require.ErrorIs(t, err, admin.ErrNotInterrupted, "another %s", name)
		require.ErrorContains(t, err, "has a stored answer")
	}
	w := p.retry("k")
	require.Equal(t, http.StatusAccepted, w.Code)
	require.Equal(t, "first", w.Body.String())
	require.Empty(t, w.Header().Get("Location"))
}

// The same Resolve or Forget sent again (go-redis resends one whose reply
// was lost; a second operator does the same) finds its own work done and
// reports success; it changes nothing.
func TestRepeatedSettleReportsSuccess(t *testing.T) {
	p := newPayments(t, "test-admin-repeat")
	answer := idempotency.Answer{Status: http.StatusAccepted, Header: http.Header{"Location": {"/payments/1"}}, Body: []byte("settled")}
	st := p.interrupted(t, "resolved")
	require.NoError(t, p.ops.Resolve(t.Context(), st, answer))
	require.NoError(t, p.ops.Resolve(t.Context(), st, answer))
	require.Equal(t, "settled", p.retry("resolved").Body.String())

	st = p.interrupted(t, "forgotten")
	require.NoError(t, p.ops.Forget(t.Context(), st))
	require.NoError(t, p.ops.Forget(t.Context(), st))
	require.Equal(t, "ran", p.retry("forgotten").Body.String())
	require.Equal(t, int32(3), p.runs.Load(), "two interrupted runs and the forgotten key's retry")
}

// A 1xx status is an interim answer: net/http would replay 103 as a 200
// and 101 as a switch of protocols. Resolve refuses it, as it refuses a
// number that is no status, and the key stays interrupted.
func TestResolveRefusesAnInterimStatus(t *testing.T) {
	p := newPayments(t, "test-admin-interim")
	st := p.interrupted(t, "k")
	for _, status := range []int{99, http.StatusContinue, http.StatusSwitchingProtocols, http.StatusEarlyHints, 199, 1000} {
		err := p.ops.Resolve(t.Context(), st, idempotency.Answer{Status: status, Body: []byte("settled")})
		require.Error(t, err, "status %d", status)
		require.NotErrorIs(t, err, admin.ErrNotInterrupted)
	}
	require.ErrorContains(t, p.ops.Resolve(t.Context(), st, idempotency.Answer{Status: http.StatusEarlyHints}), "interim")
	require.True(t, p.inspect(t, "k").Interrupted, "nothing changed")

	require.NoError(t, p.ops.Resolve(t.Context(), st, idempotency.Answer{Status: http.StatusOK, Body: []byte("settled")}))
	w := p.retry("k")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "settled", w.Body.String())
}
