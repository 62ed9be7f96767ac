package idempotency

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) observe(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) last(t *testing.T) Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	require.NotEmpty(t, l.events)
	return l.events[len(l.events)-1]
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	var log eventLog
	// A wait bound of a second: the duplicate below that waits must get
	// there, and be released, within it, on a loaded machine too.
	s := newShop(t, WithObserver(log.observe), WithWaitTimeout(time.Second))
	other := newShopOn(t, s.rdb, WithObserver(log.observe), WithKeyPrefix("test-"+t.Name()))
	c := s.client()

	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "a", `{}`).status)
	e := log.last(t)
	require.Equal(t, Executed, e.Outcome)
	require.NoError(t, e.Err)
	require.NotZero(t, e.FencingToken)
	require.False(t, e.TokenMode)
	require.Positive(t, e.Duration)

	s.post(c, "/payments", "a", `{}`)
	require.Equal(t, Replayed, log.last(t).Outcome)
	require.True(t, log.last(t).FromCache)
	other.post(c, "/payments", "a", `{}`)
	require.Equal(t, Replayed, log.last(t).Outcome)
	require.False(t, log.last(t).FromCache, "another instance replays from Redis")

	s.post(c, "/payments", "", `{}`)
	require.Equal(t, Rejected, log.last(t).Outcome)
	require.ErrorIs(t, log.last(t).Err, ErrMissingKey)
	s.post(c, "/orders", s.token(c), `{}`)
	require.True(t, log.last(t).TokenMode)

	// A duplicate that waits on the same instance, then one past the bound.
	release := make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) { <-release; s.defaultHandler(w, r) }
	done := s.postAsync(c, "/payments", "slow", `{}`)
	require.Eventually(t, func() bool { return s.execs.Load() == 3 }, 5*time.Second, time.Millisecond)
	s.post(c, "/payments", "slow", `{}`)
	require.Equal(t, Conflict, log.last(t).Outcome)
	require.ErrorIs(t, log.last(t).Err, ErrInProgress)
	require.GreaterOrEqual(t, log.last(t).Wait, 900*time.Millisecond)
	waiter := s.postAsync(c, "/payments", "slow", `{}`)
	time.Sleep(300 * time.Millisecond) // the duplicate is waiting (bound: 1 s)
	close(release)
	(<-done).must(t)
	(<-waiter).must(t)
	log.mu.Lock()
	defer log.mu.Unlock()
	waited := slices.IndexFunc(log.events, func(e Event) bool { return e.Outcome == Waited })
	require.NotEqual(t, -1, waited, "the duplicate waited, then replayed")
	require.Positive(t, log.events[waited].Wait)
}

func TestObserverSeesPanicsAndStoreErrors(t *testing.T) {
	var log eventLog
	s := newShop(t, WithObserver(log.observe))
	h := s.idem.ProtectKey(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	require.Panics(t, func() { h.ServeHTTP(discard{}, httpRequestKey(t, "p")) })
	require.Equal(t, Executed, log.last(t).Outcome)
	require.ErrorIs(t, log.last(t).Err, ErrHandlerPanicked)

	var deadLog eventLog
	dead := newShopOn(t, deadRedis(t), WithObserver(deadLog.observe), WithStoreTimeout(100*time.Millisecond))
	dead.post(dead.client(), "/payments", "k", `{}`)
	require.Equal(t, StoreError, deadLog.last(t).Outcome)
	require.ErrorIs(t, deadLog.last(t).Err, ErrStoreUnavailable)
}

func TestLogObserver(t *testing.T) {
	var buf bytes.Buffer
	s := newShop(t, WithObserver(LogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))))
	c := s.client()
	s.post(c, "/payments", "k", `{}`)
	s.post(c, "/payments", "", `{}`)
	out := buf.String()
	require.Contains(t, out, "level=DEBUG msg=idempotency outcome=executed method=POST path=/payments")
	require.Contains(t, out, "level=INFO msg=idempotency outcome=rejected")
	require.Contains(t, out, `error="idempotency: missing idempotency key"`)
	require.Equal(t, 2, strings.Count(out, "\n"))
}

// Do's refusals reach the observer with the outcome a request's get: a
// missing, a malformed or a too long key is Rejected, as over HTTP.
func TestDoRefusalsAreObserved(t *testing.T) {
	var mu sync.Mutex
	var events []Event
	m := New(redistest.Client(t, "do-refusals"), WithKeyPrefix("do-refusals"), WithCallerCredentials(), WithObserver(func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	fn := func(context.Context) (int, error) { return 1, nil }
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"", ErrMissingKey},
		{"caf\u00e9", ErrInvalidKey},
		{strings.Repeat("k", 256), ErrInvalidKey},
	} {
		_, err := Do(t.Context(), m, Key{ID: tc.id}, fn)
		require.ErrorIs(t, err, tc.want)
	}
	require.ErrorIs(t, m.Refused(t.Context(), ErrNoScope), ErrNoScope)

	h := m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil)) // no key

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 5)
	for i, want := range []error{ErrMissingKey, ErrInvalidKey, ErrInvalidKey, ErrNoScope, ErrMissingKey} {
		require.Equal(t, Rejected, events[i].Outcome, "event %d", i)
		require.ErrorIs(t, events[i].Err, want)
	}
	require.Equal(t, "function", events[0].Mode())
	require.Equal(t, "key", events[4].Mode())
}

// An observer that panics changes no answer: the first caller's and the
// replay's come whole over a real connection, and Do returns, its panic
// logged.
func TestAPanickingObserverChangesNoAnswer(t *testing.T) {
	var logged bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), nil))
	s := newShop(t, WithObserver(func(Event) { panic("the observer's bug") }), WithLogger(logger))
	c := s.client()
	first := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	again := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)

	v, err := Do(t.Context(), s.idem, Key{ID: "job"}, func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, v)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logged.String(), "the observer (WithObserver) panicked")
	require.Contains(t, logged.String(), "the observer's bug")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
