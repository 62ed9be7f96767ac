package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Answers that another attempt would only get again are returned at once,
// as they are, body included.
func TestTransportDoesNotRetryFinalAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
	}{
		{"422 key-reused", problemOf(idempotency.ErrKeyReused)},
		{"422 token-not-found", problemOf(idempotency.ErrTokenNotFound)},
		{"409 not-replayable", problemOf(idempotency.ErrNotReplayable)},
		{"409 interrupted", problemOf(idempotency.ErrInterrupted)},
		{"409 unreadable-record", problemOf(idempotency.ErrUnreadableRecord)},
		{"409 of another kind with Retry-After", answerWith(http.StatusConflict,
			`{"type":"https://example.com/probs/out-of-stock"}`, "Retry-After", "0")},
		{"500", answerWith(http.StatusInternalServerError, "failed")},
		{"429 with Retry-After", answerWith(http.StatusTooManyRequests, "slow down", "Retry-After", "0")},
		{"503 with Retry-After, replayed", answerWith(http.StatusServiceUnavailable, "provider down",
			"Retry-After", "0", ReplayedHeader, "true")},
		{"502, replayed", answerWith(http.StatusBadGateway, "upstream failed", ReplayedHeader, "true")},
		{"504, replayed", answerWith(http.StatusGatewayTimeout, "upstream slow", ReplayedHeader, "true")},
		{"409 in-progress, replayed", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(ReplayedHeader, "true")
			problemOf(idempotency.ErrInProgress)(w, r)
		}},
		{"201", answerCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := httptest.NewRecorder()
			tc.answer(want, httptest.NewRequest(http.MethodPost, "/", nil))
			srv := newScriptedServer(t, tc.answer, answerCreated)
			code, _, body := postTo(t, fastTransport(t), newPost(t, srv.URL, `{}`))
			require.Equal(t, want.Code, code)
			require.Equal(t, want.Body.String(), body)
			require.Len(t, srv.seen(), 1)
		})
	}
}

// 409 in-progress, 503 and a gateway's 502 and 504 are retried with the same key
// until another answer comes, within MaxAttempts; the last answer of an
// exhausted request is returned as it is.
func TestTransportRetriesInProgressAndUnavailable(t *testing.T) {
	inProgress := problemOf(idempotency.ErrInProgress)
	storeDown := problemOf(idempotency.ErrStoreUnavailable)
	for _, tc := range []struct {
		name     string
		script   []http.HandlerFunc
		attempts int // MaxAttempts
		status   int
		sent     int
	}{
		{"409 in-progress", []http.HandlerFunc{inProgress, answerCreated}, 0, http.StatusCreated, 2},
		{"503 store-unavailable", []http.HandlerFunc{storeDown, answerCreated}, 0, http.StatusCreated, 2},
		{"503 with Retry-After", []http.HandlerFunc{answerUnavailable, answerUnavailable, answerCreated}, 0, http.StatusCreated, 3},
		{"503 of a timeout outside", []http.HandlerFunc{answerWith(http.StatusServiceUnavailable, "timeout"), answerCreated}, 0, http.StatusCreated, 2},
		{"every attempt 503", []http.HandlerFunc{answerUnavailable}, 0, http.StatusServiceUnavailable, 5},
		{"502 of a gateway", []http.HandlerFunc{answerWith(http.StatusBadGateway, "bad gateway"), answerCreated}, 0, http.StatusCreated, 2},
		{"504 of a gateway", []http.HandlerFunc{answerWith(http.StatusGatewayTimeout, "gateway timeout"), answerCreated}, 0, http.StatusCreated, 2},
		{"MaxAttempts 2", []http.HandlerFunc{inProgress}, 2, http.StatusConflict, 2},
		{"MaxAttempts 1", []http.HandlerFunc{answerUnavailable, answerCreated}, 1, http.StatusServiceUnavailable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(t, tc.script...)
			rt := fastTransport(t)
			rt.MaxAttempts = tc.attempts
			code, _, body := postTo(t, rt, newPost(t, srv.URL, `{}`))
			require.Equal(t, tc.status, code)
			generatedKey(t, srv.seen(), tc.sent)
			want := httptest.NewRecorder()
			tc.script[min(tc.sent, len(tc.script))-1](want, httptest.NewRequest(http.MethodPost, "/", nil))
			require.Equal(t, want.Body.String(), body, "the last answer's body, unread")
		})
	}
}

// The wait before a retry is what Retry-After asks, as delay-seconds or as
// an HTTP date, and never more than MaxDelay.
func TestTransportHonoursRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter func() string
		maxDelay   time.Duration
		least      time.Duration
		most       time.Duration
	}{
		{"seconds", func() string { return "1" }, 0, time.Second, 3 * time.Second},
		{"HTTP date", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, 0,
			time.Second, 3 * time.Second},
		{"capped by MaxDelay", func() string { return "120" }, 50 * time.Millisecond,
			50 * time.Millisecond, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy := func(w http.ResponseWriter, r *http.Request) {
				answerWith(http.StatusServiceUnavailable, "", "Retry-After", tc.retryAfter())(w, r)
			}
			srv := newScriptedServer(t, busy, answerCreated)
			rt := fastTransport(t)
			rt.MaxDelay = tc.maxDelay
			code, _, _ := postTo(t, rt, newPost(t, srv.URL, `{}`))
			require.Equal(t, http.StatusCreated, code)
			seen := srv.seen()
			require.Len(t, seen, 2)
			gap := seen[1].at.Sub(seen[0].at)
			require.GreaterOrEqual(t, gap, tc.least)
			require.Less(t, gap, tc.most)
		})
	}
}

// A lost answer (the connection closed before it) is retried with the same
// key and body; a request that never gets an answer ends with the last
// error after MaxAttempts.
func TestTransportRetriesNetworkErrors(t *testing.T) {
	t.Run("answer lost twice", func(t *testing.T) {
		srv := newScriptedServer(t, hangUp, hangUp, answerCreated)
		code, _, _ := postTo(t, fastTransport(t), newPost(t, srv.URL, `{"amount":500}`))
		require.Equal(t, http.StatusCreated, code)
		keys := keysOf(t, srv.seen())
		require.Len(t, keys, 3)
		require.Equal(t, keys[0], keys[1])
		require.Equal(t, keys[0], keys[2])
	})
	t.Run("every answer lost", func(t *testing.T) {
		srv := newScriptedServer(t, hangUp)
		rt := fastTransport(t)
		rt.MaxAttempts = 3
		_, err := (&http.Client{Transport: rt}).Do(newPost(t, srv.URL, `{"amount":500}`))
		require.Error(t, err)
		keys := keysOf(t, srv.seen())
		require.Len(t, keys, 3)
		require.Equal(t, keys[0], keys[2])
	})
}

// No wait outlasts the request's deadline: a retry that could only start
// after it is not waited for, and the last answer or error comes back at
// once. A cancelled context ends a wait at once.
func TestTransportWaitsWithinTheDeadline(t *testing.T) {
	slow := &Transport{Base: fastTransport(t).Base, MaxDelay: time.Minute, BaseDelay: 30 * time.Second}
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		status int // 0: the network error
	}{
		{"Retry-After past the deadline", answerWith(http.StatusServiceUnavailable, "down", "Retry-After", "30"),
			http.StatusServiceUnavailable},
		{"back-off past the deadline", hangUp, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(t, tc.answer, answerCreated)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := slow.RoundTrip(newPost(t, srv.URL, `{}`).WithContext(ctx))
			took := time.Since(start)
			if tc.status == 0 {
				require.Error(t, err)
				require.False(t, errors.Is(err, context.DeadlineExceeded), "the network error, not the deadline's")
			} else {
				require.NoError(t, err, "the last answer, not a context error")
				resp.Body.Close()
				require.Equal(t, tc.status, resp.StatusCode)
			}
			require.Less(t, took, time.Second)
			require.Len(t, srv.seen(), 1)
		})
	}
	t.Run("cancelled while waiting", func(t *testing.T) {
		srv := newScriptedServer(t, answerWith(http.StatusServiceUnavailable, "down", "Retry-After", "30"), answerCreated)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		_, err := slow.RoundTrip(newPost(t, srv.URL, `{}`).WithContext(ctx))
		require.True(t, errors.Is(err, context.Canceled), "error %v", err)
		require.Less(t, time.Since(start), 2*time.Second)
		require.Len(t, srv.seen(), 1)
	})
}

// Answers that are retried are read and closed, so their connection
// serves the next attempt.
func TestTransportDrainsRetriedAnswers(t *testing.T) {
	srv := newScriptedServer(t, problemOf(idempotency.ErrInProgress), answerUnavailable, answerCreated)
	code, _, body := postTo(t, fastTransport(t), newPost(t, srv.URL, `{}`))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, `{"id":1}`, body)
	require.Len(t, srv.seen(), 3)
	require.Equal(t, 1, srv.connections(), "one connection for every attempt")
}

func TestTransportBackoff(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, time.Second
	for attempt, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, 40: time.Second, 1 << 20: time.Second} {
		for range 50 {
			d := backoff(base, maxDelay, attempt)
			require.GreaterOrEqual(t, d, ceiling/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, ceiling, "attempt %d", attempt)
		}
	}
}

func TestTransportParsesRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 23, 16, 23, 59, 0, time.UTC)
	for value, want := range map[string]time.Duration{
		"0": 0, "3": 3 * time.Second, now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		"Monday, 23-Nov-26 16:24:09 GMT": 10 * time.Second,
	} {
		got, ok := parseRetryAfter(value, now)
		require.True(t, ok, value)
		require.Equal(t, want, got, value)
	}
	for _, value := range []string{"", "-1", "1.5", "soon", now.Add(-time.Second).Format(http.TimeFormat)} {
		_, ok := parseRetryAfter(value, now)
		require.False(t, ok, value)
	}
}

// An error that a resend cannot change is returned after one attempt, not
// after MaxAttempts and the back-off between them: an error of the request
// itself, a TLS handshake that cannot succeed, a URL that names nothing to
// dial. Wrapped in a *url.Error, as a Base built on an http.Client
// returns it, it is the same error.
func TestTransportDoesNotRetryWhatCannotChange(t *testing.T) {
	plain := newScriptedServer(t, answerCreated)
	untrusted := httptest.NewTLSServer(answerCreated)
	t.Cleanup(untrusted.Close)
	needsClientCert := httptest.NewUnstartedServer(answerCreated)
	needsClientCert.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
	needsClientCert.StartTLS()
	t.Cleanup(needsClientCert.Close)
	asHTTPS := strings.Replace(plain.URL, "http://", "https://", 1)

	for _, tc := range []struct {
		name  string
		base  http.RoundTripper // nil: a clone of http.DefaultTransport
		url   string
		alter func(*http.Request)
	}{
		{"invalid header value", nil, plain.URL, func(r *http.Request) { r.Header.Set("X-Note", "a\nb") }},
		{"invalid header name", nil, plain.URL, func(r *http.Request) { r.Header["X Note"] = []string{"a"} }},
		{"unsupported scheme", nil, "ftp://127.0.0.1/x", nil},
		{"no host", nil, "http:///x", nil},
		{"invalid port", nil, "http://127.0.0.1:99999/x", nil},
		{"HTTPS to an HTTP server", nil, asHTTPS, nil},
		{"certificate signed by an unknown authority", nil, untrusted.URL, nil},
		{"TLS alert: client certificate required", needsClientCert.Client().Transport, needsClientCert.URL, nil},
		{"*url.Error: invalid header value", viaClient(nil), plain.URL, func(r *http.Request) { r.Header.Set("X-Note", "a\rb") }},
		{"*url.Error: HTTPS to an HTTP server", viaClient(nil), asHTTPS, nil},
		{"*url.Error: certificate signed by an unknown authority", viaClient(nil), untrusted.URL, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counting, calls := countAttempts(t, tc.base)
			req := newPost(t, tc.url, `{}`)
			if tc.alter != nil {
				tc.alter(req)
			}
			resp, err := (&Transport{Base: counting, BaseDelay: time.Millisecond}).RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			require.Error(t, err)
			require.EqualValues(t, 1, calls.Load(), "attempts; the error: %v", err)
		})
	}
	require.Len(t, plain.seen(), 0, "none of them reached the server")
}

// Failures of the connection, or of the server's side of it, may pass:
// each is retried, with the same key, until MaxAttempts, also when it comes
// wrapped in a *url.Error.
func TestTransportRetriesWhatMayPass(t *testing.T) {
	refused := func() string { // a loopback port that nobody listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ln.Close()
		return "http://" + ln.Addr().String() + "/"
	}()
	reset := newScriptedServer(t, func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0) // RST instead of FIN
			conn.Close()
		}
	})
	lost := newScriptedServer(t, hangUp)
	silent := newScriptedServer(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	impatient := fastTransport(t).Base.(*http.Transport)
	impatient.ResponseHeaderTimeout = 50 * time.Millisecond

	for _, tc := range []struct {
		name string
		base http.RoundTripper // nil: a clone of http.DefaultTransport
		url  string
	}{
		{"connection refused", nil, refused},
		{"connection reset", nil, reset.URL},
		{"connection closed before the answer", nil, lost.URL},
		{"no answer within ResponseHeaderTimeout", impatient, silent.URL},
		{"*url.Error: connection closed before the answer", viaClient(nil), lost.URL},
		{"*url.Error: connection refused", viaClient(nil), refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counting, calls := countAttempts(t, tc.base)
			rt := &Transport{Base: counting, MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
			resp, err := rt.RoundTrip(newPost(t, tc.url, `{}`))
			if resp != nil {
				resp.Body.Close()
			}
			require.Error(t, err)
			require.EqualValues(t, 3, calls.Load(), "attempts; the error: %v", err)
		})
	}
}

// viaClient sends through an http.Client over rt (nil: a clone of
// http.DefaultTransport), so that its errors come as *url.Error.
func viaClient(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	client := &http.Client{Transport: rt}
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return client.Do(r.Clone(r.Context()))
	})
}

// countAttempts wraps base (nil: a fresh clone of http.DefaultTransport)
// so that it counts the attempts that reach it.
func countAttempts(t *testing.T, base http.RoundTripper) (http.RoundTripper, *atomic.Int64) {
	if base == nil {
		base = fastTransport(t).Base
	}
	calls := new(atomic.Int64)
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return base.RoundTrip(r)
	}), calls
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Of the HTTP/2 stream resets, those of a stream whose answer a proxy lost
// (INTERNAL_ERROR), that the server did not run (REFUSED_STREAM), gave up
// (CANCEL) or shed (ENHANCE_YOUR_CALM) may pass; the resets of a request
// the server could not read are returned.
func TestTransportRetriesStreamResetsThatMayPass(t *testing.T) {
	for code, retried := range map[uint32]bool{
		0x1: false, // PROTOCOL_ERROR
		0x2: true,  // INTERNAL_ERROR
		0x7: true,  // REFUSED_STREAM
		0x8: true,  // CANCEL
		0xb: true,  // ENHANCE_YOUR_CALM
	} {
		err := h2StreamError{StreamID: 1, Code: code}
		require.Equal(t, retried, retryableError(err), "code %#x", code)
		require.Equal(t, retried, retryableError(&url.Error{Op: "Post", URL: "https://example.com/", Err: err}), "code %#x, wrapped", code)
	}
}

// panicking serves a protected route whose handler takes effect and then
// panics before its status went out, so that the middleware releases its
// key: over HTTP/2 or HTTP/1, with a recoverer outside the middleware or
// none. It returns a Transport to it (three attempts at most), the route's
// URL and the count of the handler's runs.
func panicking(t *testing.T, http2, recovered bool) (*Transport, string, *atomic.Int32) {
	prefix := fmt.Sprintf("test-client-panic-%t-%t", http2, recovered)
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	runs := new(atomic.Int32)
	var h http.Handler = idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1) // the side effect
		var receipt *struct{ ID string }
		io.WriteString(w, receipt.ID) // panics before the status went out
	}))
	if recovered {
		h = recoverer(h)
	}
	srv := httptest.NewUnstartedServer(h)
	start(t, srv, http2)
	base := srv.Client().Transport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	rt := &Transport{Base: base, MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	return rt, srv.URL + "/charges", runs
}

// Over HTTP/2 net/http resets the stream of a handler that panicked with
// INTERNAL_ERROR, which cannot be told from a front proxy's reset of an
// answer it lost: the Transport retries it, as the HTTP/1 form below.
func TestTransportRetriesTheStreamResetOfAPanic(t *testing.T) {
	rt, url, runs := panicking(t, true, false)
	_, err := (&http.Client{Transport: rt}).Do(newPost(t, url, `{"amount":500}`))
	require.ErrorContains(t, err, "INTERNAL_ERROR")
	require.EqualValues(t, 3, runs.Load(), "runs of the handler")
}

// A recoverer outside the middleware answers the panic with a 500, which
// is returned after one attempt, over either protocol.
func TestTransportReturnsARecoveredPanicAfterOneAttempt(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		rt, url, runs := panicking(t, http2, true)
		resp, err := (&http.Client{Transport: rt}).Do(newPost(t, url, `{"amount":500}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		require.EqualValues(t, 1, runs.Load(), "runs of the handler, HTTP/2 %t", http2)
	}
}

// Over HTTP/1 net/http closes the connection of a handler that panicked
// with no recoverer: the Transport cannot tell it from an answer that the
// network lost, and retries it, so that the handler runs on every attempt.
// The Transport's documentation and docs/client.md say so, and advise the
// recoverer above.
func TestTransportRetriesAnHTTP1PanicLikeALostAnswer(t *testing.T) {
	rt, url, runs := panicking(t, false, false)
	_, err := (&http.Client{Transport: rt}).Do(newPost(t, url, `{"amount":500}`))
	require.ErrorIs(t, err, io.EOF)
	require.EqualValues(t, 3, runs.Load(), "runs of the handler")
}

// recoverer answers a handler's panic with a 500, as a recovery middleware
// outside the protection does.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// stalling answers status with header name, value, … pairs, a Content-Length
// of 100,000 and only body of it, then stalls until the client closes the
// connection (or the test ends), and closes gone when it does.
func stalling(t *testing.T, status int, body string, gone chan<- struct{}, header ...string) http.HandlerFunc {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // before the server's Close, which waits for its handlers
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(status)
		io.WriteString(w, body)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // the client closed the connection
			close(gone)
		case <-stop:
		}
	}
}

// requireClosed fails unless gone is closed within a few seconds.
func requireClosed(t *testing.T, gone <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the connection was not closed", what)
	}
}

// A 409 whose problem stalls before it is whole is not known to be
// in-progress: it is returned after stallLimit, also to a request with no
// deadline, with every byte that came, and closing it closes its
// connection.
func TestTransportReturnsAConflictWhoseProblemStalls(t *testing.T) {
	const partial = `{"type":"` + inProgressProblem + `"`
	gone := make(chan struct{})
	srv := newScriptedServer(t, stalling(t, http.StatusConflict, partial, gone,
		"Content-Type", "application/problem+json", "Retry-After", "0"), answerCreated)
	start := time.Now()
	resp, err := fastTransport(t).RoundTrip(newPost(t, srv.URL, `{}`))
	require.NoError(t, err)
	require.Less(t, time.Since(start), stallLimit+time.Second)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Len(t, srv.seen(), 1, "not retried")
	got := make([]byte, len(partial))
	_, err = io.ReadFull(resp.Body, got)
	require.NoError(t, err)
	require.Equal(t, partial, string(got), "the caller reads what came")
	require.NoError(t, resp.Body.Close())
	requireClosed(t, gone, "the returned answer")
}

// A retried answer whose body stalls (a 503 with Retry-After, or a 409
// whose whole in-progress problem came and then the body stalled) costs
// its connection and drainGrace at most, also with no deadline: the
// request is sent again, and an answer that always stalls is returned
// after MaxAttempts.
func TestTransportRetriesPastAStalledBody(t *testing.T) {
	inProgress := `{"type":"` + inProgressProblem + `","status":409}`
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"503 with Retry-After", http.StatusServiceUnavailable, "try"},
		{"409 in-progress", http.StatusConflict, inProgress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone := make(chan struct{})
			srv := newScriptedServer(t, stalling(t, tc.status, tc.body, gone,
				"Content-Type", "application/problem+json", "Retry-After", "0"), answerCreated)
			start := time.Now()
			resp, err := fastTransport(t).RoundTrip(newPost(t, srv.URL, `{}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Less(t, time.Since(start), drainGrace+500*time.Millisecond)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Len(t, srv.seen(), 2)
			requireClosed(t, gone, "the retried answer")

			always := make(chan struct{}, defaultAttempts)
			stalls := newScriptedServer(t, func(w http.ResponseWriter, r *http.Request) {
				gone := make(chan struct{})
				go func() { <-gone; always <- struct{}{} }()
				stalling(t, tc.status, tc.body, gone, "Content-Type", "application/problem+json", "Retry-After", "0")(w, r)
			})
			start = time.Now()
			resp, err = fastTransport(t).RoundTrip(newPost(t, stalls.URL, `{}`))
			require.NoError(t, err)
			require.Less(t, time.Since(start), defaultAttempts*drainGrace+time.Second)
			require.Equal(t, tc.status, resp.StatusCode, "the last answer")
			require.Len(t, stalls.seen(), defaultAttempts)
			require.NoError(t, resp.Body.Close())
			for range defaultAttempts {
				requireClosed(t, always, "every attempt's answer")
			}
		})
	}
}
