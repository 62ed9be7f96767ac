package idempotency

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// statusSequence answers the given statuses in turn, then 201.
func statusSequence(s *shop, statuses ...int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := int(s.execs.Load())
		status := http.StatusCreated
		if n <= len(statuses) {
			status = statuses[n-1]
		}
		w.WriteHeader(status)
		w.Write([]byte(itoa(int64(n))))
	}
}

func TestStorePolicies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   StorePolicy
		status   int
		released bool
	}{
		{"store all keeps a 429", StoreAll, 429, false},
		{"2xx only releases a 429", Store2xxOnly, 429, true},
		{"2xx only releases a 422", Store2xxOnly, 422, true},
		{"no transient releases a 429", StoreNoTransient, 429, true},
		{"no transient releases a 503", StoreNoTransient, 503, true},
		{"no transient keeps a 422", StoreNoTransient, 422, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events eventLog
			s := newShop(t, WithStorePolicy(tc.policy), WithObserver(events.observe))
			s.handler = statusSequence(s, tc.status)
			c := s.client()
			first := s.post(c, "/payments", "k", `{}`)
			require.Equal(t, tc.status, first.status)
			require.Equal(t, tc.released, events.last(t).Released)
			retry := s.post(c, "/payments", "k", `{}`)
			if tc.released {
				require.Equal(t, http.StatusCreated, retry.status, "the retry ran again")
				require.EqualValues(t, 2, s.execs.Load())
				require.Equal(t, "true", s.post(c, "/payments", "k", `{}`).header.Get(ReplayedHeader))
			} else {
				require.Equal(t, tc.status, retry.status)
				require.Equal(t, "true", retry.header.Get(ReplayedHeader))
				require.EqualValues(t, 1, s.execs.Load())
			}
		})
	}
}

func TestStorePolicyShorterLifetime(t *testing.T) {
	var events eventLog
	// A lifetime below the wait timeout is raised to it (and to a second),
	// so that a duplicate that waited finds the answer.
	s := newShop(t, WithObserver(events.observe), WithWaitTimeout(time.Second),
		WithStorePolicy(func(_ *http.Request, status int) StoreDecision {
			return StoreDecision{TTL: time.Nanosecond}
		}))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "short", `{}`).status)
	require.Equal(t, time.Second, events.last(t).StoredFor)
	require.Equal(t, "true", s.post(c, "/payments", "short", `{}`).header.Get(ReplayedHeader))
	require.Positive(t, s.rdb.PTTL(t.Context(), clientKeys(s.idem.cfg.prefix, paymentID("short")).record).Val())
	time.Sleep(1300 * time.Millisecond)
	require.Empty(t, s.post(c, "/payments", "short", `{}`).header.Get(ReplayedHeader), "it ran again")
	require.EqualValues(t, 2, s.execs.Load())
}

// A handler that finds the request invalid before any side effect releases
// its key: the client fixes the request and retries with the same key.
func TestHandlerReleasesItsKey(t *testing.T) {
	s := newShop(t)
	var inside atomic.Bool
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if s.execs.Load() == 1 {
			inside.Store(Release(r.Context()))
			http.Error(w, "quantity missing", http.StatusBadRequest)
			return
		}
		s.defaultHandler(w, r)
	}
	c := s.client()
	require.Equal(t, http.StatusBadRequest, s.post(c, "/payments", "fix-me", `{}`).status)
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "fix-me", `{}`).status)
	require.Equal(t, "true", s.post(c, "/payments", "fix-me", `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 2, s.execs.Load())
	require.True(t, inside.Load(), "Release knew the protected execution")
	require.False(t, Release(t.Context()), "outside a protected execution")
}

// Safe methods pass through a protected route without spending its key.
func TestSafeMethodsPassThrough(t *testing.T) {
	var events eventLog
	s := newShop(t, WithObserver(events.observe))
	var execs atomic.Int64
	h := s.idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(method string) int {
		req, _ := http.NewRequest(method, "/things", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "same")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for _, method := range []string{http.MethodHead, http.MethodGet, http.MethodOptions} {
		send(method)
		require.Equal(t, Unprotected, events.last(t).Outcome, method)
	}
	require.EqualValues(t, 3, execs.Load())
	require.Equal(t, http.StatusCreated, send(http.MethodPost))
	send(http.MethodPost)
	require.Equal(t, Replayed, events.last(t).Outcome, "the key was not spent by the safe methods")
	require.EqualValues(t, 4, execs.Load())

	send("post")
	require.Equal(t, Rejected, events.last(t).Outcome, "a lower-case post is protected (and differs from POST)")

	allButPost := New(s.rdb, WithKeyPrefix(s.idem.cfg.prefix+"-put"), WithCallerCredentials(), WithUnprotectedMethods("POST"), WithObserver(events.observe))
	h = allButPost.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { execs.Add(1) }))
	send(http.MethodPost)
	require.Equal(t, Unprotected, events.last(t).Outcome)
	send(http.MethodGet)
	require.Equal(t, Executed, events.last(t).Outcome)
	send("BREW")
	require.Equal(t, Rejected, events.last(t).Outcome, "an unknown method is protected (the key ran a GET)")
}

func TestOptionalKey(t *testing.T) {
	var events eventLog
	s := newShop(t, WithOptionalKey(), WithObserver(events.observe))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "", `{}`).status)
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "", `{}`).status)
	require.Equal(t, Unprotected, events.last(t).Outcome)
	require.EqualValues(t, 2, s.execs.Load())
	requireProblem(t, s.post(c, "/payments", strings.Repeat("k", 300), `{}`), 400, "invalid-key")
}

// Idempotency-Key as the IETF draft writes it, a Structured Field string,
// is the same key as its bare value.
func TestStructuredFieldKeys(t *testing.T) {
	s := newShop(t)
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{}`).status)
	bare := s.post(c, "/payments", `8e03978e-40d5-43e8-bc93-6894a57f9324`, `{}`)
	require.Equal(t, "true", bare.header.Get(ReplayedHeader))
	withParams := s.post(c, "/payments", `"8e03978e-40d5-43e8-bc93-6894a57f9324";v=1`, `{}`)
	require.Equal(t, "true", withParams.header.Get(ReplayedHeader))
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", `"a\"b\\c"`, `{}`).status)
	require.Equal(t, "true", s.post(c, "/payments", `a"b\c`, `{}`).header.Get(ReplayedHeader))
	for _, bad := range []string{`"open`, `"a\b"`, `"a" b`, `"ü"`} {
		requireProblem(t, s.post(c, "/payments", bad, `{}`), 400, "invalid-key")
	}
	requireProblem(t, s.post(c, "/payments", `""`, `{}`), 400, "invalid-key")
	require.EqualValues(t, 2, s.execs.Load())
}

func TestReplayHook(t *testing.T) {
	var seen atomic.Int64
	s := newShop(t, WithReplayHook(func(r *http.Request, status int, h http.Header) {
		if status == http.StatusCreated && h.Get(ReplayedHeader) == "true" {
			h.Set("X-Replays", itoa(seen.Add(1)))
		}
	}))
	c := s.client()
	first := s.post(c, "/payments", "hook", `{}`)
	require.Empty(t, first.header.Get("X-Replays"), "the first answer is no replay")
	require.Equal(t, "1", s.post(c, "/payments", "hook", `{}`).header.Get("X-Replays"))
	require.Equal(t, "2", s.post(c, "/payments", "hook", `{}`).header.Get("X-Replays"))
}

// The expiry header tells every answer how long its key is replayed, and
// counts down across replays, from Redis and from memory alike.
func TestExpiryHeaderCountsDown(t *testing.T) {
	s := newShop(t, WithExpiryHeader("Idempotency-Key-Expires-In"), WithRecordTTL(time.Minute),
		WithStorePolicy(func(_ *http.Request, status int) StoreDecision {
			return StoreDecision{Release: status == http.StatusTooManyRequests}
		}))
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix), WithExpiryHeader("Idempotency-Key-Expires-In"),
		WithRecordTTL(time.Minute), WithResponseCache(0, 0))
	c := s.client()
	first := s.post(c, "/payments", "ttl", `{}`)
	require.Equal(t, "60", first.header.Get("Idempotency-Key-Expires-In"))
	time.Sleep(1100 * time.Millisecond)
	for _, replay := range []answer{s.post(c, "/payments", "ttl", `{}`), other.post(c, "/payments", "ttl", `{}`)} {
		require.Equal(t, "true", replay.header.Get(ReplayedHeader))
		left, err := strconv.Atoi(replay.header.Get("Idempotency-Key-Expires-In"))
		require.NoError(t, err)
		require.InDelta(t, 58, left, 1)
	}
	s.handler = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTooManyRequests) }
	released := s.post(c, "/payments", "released", `{}`)
	require.Equal(t, http.StatusTooManyRequests, released.status)
	require.Empty(t, released.header.Get("Idempotency-Key-Expires-In"), "a released answer is not kept")
}

// A duplicate that waited past the bound is told to come back after a lease.
func TestInProgressRetryAfterFollowsTheLease(t *testing.T) {
	s := newShop(t, WithLockLease(4*time.Second), WithWaitTimeout(100*time.Millisecond))
	release := make(chan struct{})
	defer close(release)
	s.handler = func(w http.ResponseWriter, r *http.Request) { <-release }
	c := s.client()
	s.postAsync(c, "/payments", "busy", `{}`)
	require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
	a := s.post(c, "/payments", "busy", `{}`)
	requireProblem(t, a, http.StatusConflict, "in-progress")
	require.Equal(t, "4", a.header.Get("Retry-After"))
	require.Equal(t, 4*time.Second, RetryAfter(retryAfter{ErrInProgress, 4 * time.Second}))
	require.Equal(t, time.Second, RetryAfter(ErrStoreUnavailable))
	require.Zero(t, RetryAfter(ErrKeyReused))
}

// The policy decides for answers that cannot be replayed too: a large 502
// under Store2xxOnly releases its key instead of blocking it for a day.
func TestStorePolicyCoversAnswersTooLargeToStore(t *testing.T) {
	s := newShop(t, WithStorePolicy(Store2xxOnly), WithMaxResponseBytes(10))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusBadGateway
		if s.execs.Load() > 1 {
			status = http.StatusCreated
		}
		w.WriteHeader(status)
		w.Write([]byte(strings.Repeat("x", 100)))
	}
	c := s.client()
	require.Equal(t, http.StatusBadGateway, s.post(c, "/payments", "big", `{}`).status)
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "big", `{}`).status, "released: the retry ran")
	requireProblem(t, s.post(c, "/payments", "big", `{}`), http.StatusConflict, "not-replayable")
	require.EqualValues(t, 2, s.execs.Load())
}

// Release after the handler returned takes no effect, and says so.
func TestLateReleaseTakesNoEffect(t *testing.T) {
	s := newShop(t)
	contexts := make(chan context.Context, 1)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		contexts <- r.Context()
		s.defaultHandler(w, r)
	}
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "late", `{}`).status)
	require.False(t, Release(<-contexts))
	require.Equal(t, "true", s.post(c, "/payments", "late", `{}`).header.Get(ReplayedHeader))
}

// WithOptionalKey is for key mode: a form posted without its token is
// refused, never run unprotected.
func TestOptionalKeyLeavesTokenModeStrict(t *testing.T) {
	s := newShop(t, WithOptionalKey())
	c := s.client()
	s.token(c)
	requireProblem(t, s.post(c, "/orders", "", `{}`), 400, "missing-key")
	require.Zero(t, s.execs.Load())
}

// A fingerprint function may read the body; the handler still gets it whole.
func TestFingerprinterReadingTheBody(t *testing.T) {
	s := newShop(t, WithFingerprint(func(r *http.Request, body []byte) []byte {
		b, _ := io.ReadAll(r.Body)
		return b
	}))
	a := s.post(s.client(), "/payments", "body", `{"item":"tea"}`)
	require.Equal(t, `{"item":"tea"}`, a.header.Get("X-Request-Body"))
}
