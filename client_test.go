package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/client"
	"github.com/stretchr/testify/require"
)

// The client package imports nothing of this one, so that a program that
// only calls protected endpoints compiles no Redis. These tests keep the
// two in step: the headers the client sends and reads are the ones the
// middleware reads and sends, and the problems it retries are exactly the
// ones a retry with the same key can change.

func TestClientSpeaksTheMiddlewaresHeaders(t *testing.T) {
	require.Equal(t, KeyHeader, client.KeyHeader)
	require.Equal(t, ReplayedHeader, client.ReplayedHeader)
}

// Every problem the middleware answers, as DefaultErrorHandler writes it:
// the client retries in-progress (the first attempt still runs) and
// store-unavailable (nothing ran), and no other, so that a problem added
// here without a decision on the client's side fails this test.
func TestClientRetriesExactlyTheRetryableProblems(t *testing.T) {
	retried := map[string]bool{"in-progress": true, "store-unavailable": true}
	for _, p := range append(problems, internalProblem) {
		t.Run(p.slug, func(t *testing.T) {
			var attempts atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if attempts.Add(1) == 1 {
					DefaultErrorHandler(w, r, p.err)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			t.Cleanup(srv.Close)
			resp := postThrough(t, fastClient(t), srv.URL)
			if retried[p.slug] {
				require.Equal(t, http.StatusCreated, resp.status)
				require.EqualValues(t, 2, attempts.Load())
				return
			}
			require.Equal(t, p.status, resp.status)
			require.EqualValues(t, 1, attempts.Load())
		})
	}
}

// Behind WithOptionalKey, a request whose key header is empty would run
// unprotected on every attempt. With the key the client gives it, two
// lost answers cost no second execution: the third attempt is the replay.
func TestClientEmptyKeyHeaderRunsOnceBehindOptionalKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"nil", nil},
		{"empty value", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, WithOptionalKey())
			var answers atomic.Int64
			lossy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if answers.Add(1) > 2 {
					s.srv.Config.Handler.ServeHTTP(w, r)
					return
				}
				s.srv.Config.Handler.ServeHTTP(httptest.NewRecorder(), r) // it runs,
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close() // and its answer is lost
				}
			}))
			t.Cleanup(lossy.Close)
			resp := postThrough(t, fastClient(t), lossy.URL+"/payments", tc.values...)
			require.Equal(t, http.StatusCreated, resp.status)
			require.Equal(t, "true", resp.header.Get(ReplayedHeader))
			require.EqualValues(t, 1, s.execs.Load())
			require.EqualValues(t, 3, answers.Load())
		})
	}
}

// A handler's 503 with Retry-After is stored like any answer (StoreAll):
// the retry gets its replay, and a replay is the key's answer for good, so
// the client returns it instead of asking for the same copy again.
func TestClientStopsAtAReplayedAnswer(t *testing.T) {
	s := newShop(t)
	s.handler = func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "provider down")
	}
	var attempts atomic.Int64
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		s.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)
	resp := postThrough(t, fastClient(t), counting.URL+"/payments")
	require.Equal(t, http.StatusServiceUnavailable, resp.status)
	require.Equal(t, "true", resp.header.Get(ReplayedHeader))
	require.Equal(t, "provider down", resp.body)
	require.EqualValues(t, 1, s.execs.Load())
	require.EqualValues(t, 2, attempts.Load(), "the first answer, then its replay")
}

// fastClient is a client.Transport whose back-off is short enough for
// tests, on a connection pool of its own.
func fastClient(t *testing.T) *client.Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	return &client.Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}
}

// postThrough POSTs a JSON payment through rt, with key as its
// Idempotency-Key values when given, and reads the answer in full.
func postThrough(t *testing.T, rt http.RoundTripper, url string, key ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":500}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != nil {
		req.Header[KeyHeader] = key
	}
	return do(t, &http.Client{Transport: rt}, req)
}
