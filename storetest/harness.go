package storetest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
)

// bound is how long anything in the kit may wait for something that
// should happen: long enough for a busy machine, short enough that a
// broken promise fails rather than hangs.
const bound = 10 * time.Second

// open opens an instance's middleware, logging to t while t runs, and
// drains it when t ends.
func open(t *testing.T, ks Keyspace, opts ...idempotency.Option) *idempotency.Middleware {
	t.Helper()
	m := ks(append([]idempotency.Option{idempotency.WithLogger(testLogger(t))}, opts...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Logf("storetest: draining an instance: %v", err)
		}
	})
	return m
}

// An instance is one instance of the service under test, on loopback.
type instance struct {
	m    *idempotency.Middleware
	base string // the server's URL
	url  string // the protected route's
	// arrivals counts the requests that reached the server, before the
	// middleware saw them.
	arrivals atomic.Int64
}

// serveKey serves h in key mode (ProtectKey) on an instance of ks.
func serveKey(t *testing.T, ks Keyspace, h http.Handler, opts ...idempotency.Option) *instance {
	t.Helper()
	in := &instance{m: open(t, ks, opts...)}
	in.serve(t, in.m.ProtectKey(h))
	return in
}

// serveToken serves h in token mode (Protect) on an instance of ks, and
// its token endpoint at /token.
func serveToken(t *testing.T, ks Keyspace, h http.Handler, opts ...idempotency.Option) *instance {
	t.Helper()
	in := &instance{m: open(t, ks, opts...)}
	mux := http.NewServeMux()
	mux.Handle("/token", in.m.TokenHandler())
	mux.Handle("/", in.m.Protect(h))
	in.serve(t, mux)
	return in
}

// serve serves protected behind a recoverer, as a server would: a panic
// that goes on through the middleware is answered 500.
func (in *instance) serve(t *testing.T, protected http.Handler) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.arrivals.Add(1)
		defer func() {
			if v := recover(); v != nil {
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, "recovered")
			}
		}()
		protected.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	in.base, in.url = srv.URL, srv.URL+"/orders"
}

// client is the kit's HTTP client: loopback only, bounded.
var client = &http.Client{Timeout: 3 * bound}

// An answer is a response read in full.
type answer struct {
	status int
	header http.Header
	body   string
	err    error // of a request sent in the background (goSend), which got no answer
}

func (a answer) replayed() bool { return a.header.Get(idempotency.ReplayedHeader) == "true" }

// same is what a client compares of two answers: status, body and the
// handler's own header.
func (a answer) same() string {
	return strconv.Itoa(a.status) + " X-Order=" + a.header.Get("X-Order") + " " + a.body
}

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return a.same() + " replayed=" + strconv.FormatBool(a.replayed())
}

// send POSTs body to url with the key in Idempotency-Key (none when "")
// and the given headers (name, value pairs).
func send(url, key, body string, header ...string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.KeyHeader, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// goSend sends in the background; the answer comes on the channel.
func goSend(url, key, body string, header ...string) <-chan answer {
	// The error travels in the answer, which the test reads: a test that
	// failed meanwhile has ended, and t may not be told of it any more.
	done := make(chan answer, 1)
	go func() {
		a, err := send(url, key, body, header...)
		a.err = err
		done <- a
	}()
	return done
}

// settle returns once in has seen n requests arrive, and a moment after,
// so that the last one has likely reached the key: a test that then lets
// the key's run finish has a duplicate that waited for it. When it had
// not got that far, it finds the answer stored, which must read the same:
// nothing passes or fails by this timing.
func settle(in *instance, n int64) {
	eventually(func() bool { return in.arrivals.Load() >= n })
	time.Sleep(200 * time.Millisecond)
}

// post is send, from the test's goroutine.
func post(t *testing.T, url, key, body string, header ...string) answer {
	t.Helper()
	a, err := send(url, key, body, header...)
	require.NoError(t, err)
	return a
}

// requireProblem asserts that a is the problem of the given status and
// type (the slug after idempotency.ProblemTypeBase): the stable part of
// the answer, not its prose.
func requireProblem(t *testing.T, a answer, status int, slug string) {
	t.Helper()
	require.Equal(t, status, a.status, "answer: %s", a)
	require.Contains(t, a.header.Get("Content-Type"), "application/problem+json", "answer: %s", a)
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &p), "answer: %s", a)
	require.Equal(t, idempotency.ProblemTypeBase+slug, p.Type)
	require.Equal(t, status, p.Status)
}

// requireReplay asserts that a is want, replayed.
func requireReplay(t *testing.T, want, a answer) {
	t.Helper()
	require.Equal(t, want.same(), a.same())
	require.True(t, a.replayed(), "answer not marked %s: %s", idempotency.ReplayedHeader, a)
}

// runs counts a handler's or function's runs and notes each run's
// fencing token.
type runs struct {
	n      atomic.Int64
	mu     sync.Mutex
	fences []uint64
}

// start counts a run on ctx and returns its number, from 1.
func (c *runs) start(ctx context.Context) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fences = append(c.fences, idempotency.FencingToken(ctx))
	return c.n.Add(1)
}

func (c *runs) count() int64 { return c.n.Load() }

// fence is the fencing token of run i (from 1).
func (c *runs) fence(i int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fences[i-1]
}

// requireFencesGrow asserts that every run had a fencing token, each
// greater than the one before.
func (c *runs) requireFencesGrow(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, f := range c.fences {
		require.NotZero(t, f, "run %d had no fencing token", i+1)
		if i > 0 {
			require.Greater(t, f, c.fences[i-1], "run %d's fencing token is not above run %d's", i+1, i)
		}
	}
}

// created answers like an order endpoint: 201, the run's number in the
// body and in a header of the handler's own.
func created(w http.ResponseWriter, run int64, what string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", strconv.FormatInt(run, 10))
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(struct {
		Order int64  `json:"order"`
		What  string `json:"what"`
	}{run, what})
}

// await waits for ch to close, at most bound; it reports whether it did.
func await(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(bound):
		return false
	}
}

// eventually waits for cond, at most bound; it reports whether it held.
func eventually(cond func() bool) bool { return eventuallyWithin(bound, cond) }

// eventuallyWithin waits for cond, at most d; it reports whether it held.
func eventuallyWithin(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// testLogger logs to t while t runs; what background work logs after
// that is dropped, since t may not log any more.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
