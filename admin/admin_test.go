package admin_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix),
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
