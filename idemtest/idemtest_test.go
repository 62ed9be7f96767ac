package idemtest_test

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/idemtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// payments is a key-mode route whose handler counts its runs; handle, when
// set, answers instead of the default 201.
type payments struct {
	runs   atomic.Int64
	handle func(w http.ResponseWriter, r *http.Request)
	srv    *httptest.Server
}

func newPayments(t *testing.T, idem *idempotency.Middleware) *payments {
	p := &payments{}
	p.srv = httptest.NewServer(idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.runs.Add(1)
		if p.handle != nil {
			p.handle(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"payment":`+itoa(n)+`}`)
	})))
	t.Cleanup(p.srv.Close)
	return p
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

type answer struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, c *http.Client, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.KeyHeader, key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// problem is the problem type's name of a problem+json answer.
func problem(a answer) string {
	_, name, _ := strings.Cut(a.body, "#problem-")
	name, _, _ = strings.Cut(name, `"`)
	return name
}

func TestKeyModeRunsOnceAndReplays(t *testing.T) {
	p := newPayments(t, idemtest.New(t, idempotency.WithCallerCredentials()))
	first := post(t, http.DefaultClient, p.srv.URL, "pay-1", `{"amount":5}`)
	again := post(t, http.DefaultClient, p.srv.URL, "pay-1", `{"amount":5}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, first.status, again.status)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.runs.Load())

	other := post(t, http.DefaultClient, p.srv.URL, "pay-1", `{"amount":6}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.status)
	require.Equal(t, "key-reused", problem(other))
	require.Equal(t, "missing-key", problem(post(t, http.DefaultClient, p.srv.URL, "", `{}`)))
}

func TestTokenMode(t *testing.T) {
	idem := idemtest.New(t)
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("GET /idempotency/token", idem.TokenHandler())
	mux.Handle("POST /orders", idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}

	resp, err := c.Get(srv.URL + "/idempotency/token")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, token, _ := strings.Cut(string(body), `"token":"`)
	token, _, _ = strings.Cut(token, `"`)
	require.NotEmpty(t, token, string(body))

	require.Equal(t, http.StatusCreated, post(t, c, srv.URL+"/orders", token, `{}`).status)
	replay := post(t, c, srv.URL+"/orders", token, `{}`)
	require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, runs.Load())
	// Another session does not know the token.
	require.Equal(t, "token-not-found", problem(post(t, http.DefaultClient, srv.URL+"/orders", token, `{}`)))
}

// A duplicate on another instance waits for the first to finish (the
// waiters' pub/sub) and replays its answer.
func TestDuplicateOnAnotherInstanceWaits(t *testing.T) {
	r := idemtest.NewRedis(t)
	a, b := newPayments(t, r.New(idempotency.WithCallerCredentials())), newPayments(t, r.New(idempotency.WithCallerCredentials()))
	started, finish := make(chan struct{}), make(chan struct{})
	a.handle = func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-finish
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}
	firstDone := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, a.srv.URL, strings.NewReader(`{}`))
		req.Header.Set(idempotency.KeyHeader, "slow")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			firstDone <- answer{status: -1, body: err.Error()}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		firstDone <- answer{resp.StatusCode, resp.Header, string(body)}
	}()
	<-started
	go func() {
		time.Sleep(100 * time.Millisecond) // the duplicate is waiting by then, or finds the answer
		close(finish)
	}()
	dup := post(t, http.DefaultClient, b.srv.URL, "slow", `{}`)
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, http.StatusCreated, dup.status, dup.body)
	require.Equal(t, "paid", dup.body)
	require.Equal(t, "true", dup.header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, a.runs.Load()+b.runs.Load())
}

// A lease shorter than the handler is renewed (renew.lua) while
// the handler runs.
func TestLeaseRenewedWhileTheHandlerRuns(t *testing.T) {
	p := newPayments(t, idemtest.New(t, idempotency.WithCallerCredentials(), idempotency.WithLockLease(100*time.Millisecond)))
	p.handle = func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}
	require.Equal(t, http.StatusCreated, post(t, http.DefaultClient, p.srv.URL, "long", `{}`).status)
	require.Equal(t, "true", post(t, http.DefaultClient, p.srv.URL, "long", `{}`).header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.runs.Load())
}

// A handler that releases its key (release.lua) lets the retry run again.
func TestReleasedKeyRunsAgain(t *testing.T) {
	p := newPayments(t, idemtest.New(t, idempotency.WithCallerCredentials()))
	p.handle = func(w http.ResponseWriter, r *http.Request) {
		if idempotency.Release(r.Context()) {
			w.WriteHeader(http.StatusUnprocessableEntity)
		}
	}
	require.Equal(t, http.StatusUnprocessableEntity, post(t, http.DefaultClient, p.srv.URL, "fix-me", `{}`).status)
	require.Equal(t, http.StatusUnprocessableEntity, post(t, http.DefaultClient, p.srv.URL, "fix-me", `{}`).status)
	require.EqualValues(t, 2, p.runs.Load())
}

func TestDo(t *testing.T) {
	idem := idemtest.New(t, idempotency.WithCallerCredentials())
	var runs atomic.Int64
	charge := func(context.Context) (string, error) { return "receipt-" + itoa(runs.Add(1)), nil }
	key := idempotency.Key{Scope: "orders-queue", ID: "msg-1", Input: []byte(`{"amount":5}`)}
	first, err := idempotency.Do(t.Context(), idem, key, charge)
	require.NoError(t, err)
	again, err := idempotency.Do(t.Context(), idem, key, charge)
	require.NoError(t, err)
	require.Equal(t, "receipt-1", first)
	require.Equal(t, first, again)
	require.EqualValues(t, 1, runs.Load())
}

// The operator's scripts: a key kept as interrupted (the handler died
// after its status went out) is found by Interrupted, read by Inspect,
// and settled by Resolve or Forget.
func TestOperatorSettlesInterruptedKeys(t *testing.T) {
	idem := idemtest.New(t, idempotency.WithCallerCredentials())
	p := newPayments(t, idem)
	p.handle = func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the status went out: the key is kept
	}
	interrupt := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, p.srv.URL, strings.NewReader(`{}`))
		req.Header.Set(idempotency.KeyHeader, key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		require.Equal(t, "interrupted", problem(post(t, http.DefaultClient, p.srv.URL, key, `{}`)))
	}
	interrupt("resolve-me")
	interrupt("forget-me")
	p.handle = nil

	var found []admin.KeyState
	for st, err := range admin.New(idem).Interrupted(t.Context()) {
		require.NoError(t, err)
		found = append(found, st)
	}
	require.Len(t, found, 2)
	for _, st := range found {
		again, err := admin.New(idem).Inspect(t.Context(), st.Key)
		require.NoError(t, err)
		require.True(t, again.Interrupted)
		require.Equal(t, "run", again.State)
	}
	// Which is which: Resolve the first, Forget the second.
	require.NoError(t, admin.New(idem).Resolve(t.Context(), found[0], idempotency.Answer{Status: http.StatusCreated, Body: []byte("settled")}))
	require.NoError(t, admin.New(idem).Forget(t.Context(), found[1]))
	a, b := post(t, http.DefaultClient, p.srv.URL, "resolve-me", `{}`), post(t, http.DefaultClient, p.srv.URL, "forget-me", `{}`)
	bodies := []string{a.body, b.body}
	assert.Contains(t, bodies, "settled", "the resolved key replays the operator's answer")
	assert.Contains(t, bodies, `{"payment":3}`, "the forgotten key runs again")
	require.EqualValues(t, 3, p.runs.Load())
}

// FastForward moves the in-process Redis's clock: a record past its TTL
// is gone, and the key runs again. The clock of the in-process response
// cache moves with it: the instance that stored the answer (and would
// replay it from memory) runs the key again too, and keeps caching after.
func TestFastForwardExpiresRecords(t *testing.T) {
	r := idemtest.NewRedis(t)
	p := newPayments(t, r.New(idempotency.WithCallerCredentials(), idempotency.WithRecordTTL(time.Hour)))
	var fromCache atomic.Int64
	cached := newPayments(t, r.New(idempotency.WithCallerCredentials(), idempotency.WithRecordTTL(time.Hour), idempotency.WithObserver(func(e idempotency.Event) {
		if e.FromCache {
			fromCache.Add(1)
		}
	})))
	post(t, http.DefaultClient, p.srv.URL, "hourly", `{}`)
	post(t, http.DefaultClient, p.srv.URL, "hourly", `{}`) // from the cache
	require.EqualValues(t, 1, p.runs.Load())
	r.FastForward(time.Hour + time.Second)
	post(t, http.DefaultClient, p.srv.URL, "hourly", `{}`)
	require.EqualValues(t, 2, p.runs.Load(), "not replayed from the cache past the record's TTL")

	post(t, http.DefaultClient, cached.srv.URL, "later", `{}`)
	post(t, http.DefaultClient, cached.srv.URL, "later", `{}`)
	require.EqualValues(t, 1, fromCache.Load(), "entries made after a FastForward still answer")
	r.FastForward(time.Hour + time.Second)
	post(t, http.DefaultClient, cached.srv.URL, "later", `{}`)
	require.EqualValues(t, 2, cached.runs.Load())
}

// SetError stands in for a Redis that is down: the middleware fails closed.
func TestRedisDownFailsClosed(t *testing.T) {
	r := idemtest.NewRedis(t)
	p := newPayments(t, r.New(idempotency.WithCallerCredentials()))
	r.SetError("down for the test")
	a := post(t, http.DefaultClient, p.srv.URL, "k", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, a.status)
	require.Equal(t, "store-unavailable", problem(a))
	require.Zero(t, p.runs.Load())
	r.SetError("")
	require.Equal(t, http.StatusCreated, post(t, http.DefaultClient, p.srv.URL, "k", `{}`).status)
}

// WithReplicaAcks needs WAIT, which the in-process Redis lacks: every
// claim is refused, as the package documentation says.
func TestReplicaAcksNeedARealRedis(t *testing.T) {
	p := newPayments(t, idemtest.New(t, idempotency.WithCallerCredentials(), idempotency.WithReplicaAcks(1, 100*time.Millisecond)))
	a := post(t, http.DefaultClient, p.srv.URL, "k", `{}`)
	require.Equal(t, "store-unavailable", problem(a))
	require.Zero(t, p.runs.Load())
}

// Every Lua script the middleware runs (claim, renew, complete, release,
// keep, and the operator's inspect and settle) runs on miniredis without
// an error: each step of a key's life, watched at the client.
func TestEveryScriptRunsOnMiniredis(t *testing.T) {
	r := idemtest.NewRedis(t)
	scripts := &scriptWatch{ran: map[string]bool{}}
	r.Client().AddHook(scripts)
	idem := r.New(idempotency.WithCallerCredentials(), idempotency.WithLockLease(100*time.Millisecond))
	p := newPayments(t, idem)
	p.handle = func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get(idempotency.KeyHeader) {
		case "long": // the lease is renewed: renew.lua
			time.Sleep(250 * time.Millisecond)
		case "release": // release.lua
			idempotency.Release(r.Context())
		case "interrupt": // kept, for the operator's scripts
			w.WriteHeader(http.StatusCreated)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}
	for _, key := range []string{"long", "long", "release", "interrupt"} {
		req, _ := http.NewRequest(http.MethodPost, p.srv.URL, strings.NewReader(`{}`))
		req.Header.Set(idempotency.KeyHeader, key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for st, err := range admin.New(idem).Interrupted(t.Context()) {
		require.NoError(t, err)
		require.NoError(t, admin.New(idem).Forget(t.Context(), st))
	}
	require.Empty(t, scripts.failures(), "scripts refused by miniredis")
	t.Logf("%d distinct scripts ran", scripts.count())
	require.GreaterOrEqual(t, scripts.count(), 7, "distinct scripts that ran")
}

// scriptWatch is a go-redis hook that records which scripts ran (by SHA1)
// and every script reply that was an error other than NOSCRIPT, which
// go-redis answers by sending the script itself.
type scriptWatch struct {
	mu     sync.Mutex
	ran    map[string]bool
	failed []string
}

func (w *scriptWatch) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *scriptWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		w.record(cmd)
		return err
	}
}

func (w *scriptWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			w.record(cmd)
		}
		return err
	}
}

func (w *scriptWatch) record(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	var sha string
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		sha, _ = args[1].(string)
	case "eval":
		src, _ := args[1].(string)
		sha = fmt.Sprintf("%x", sha1.Sum([]byte(src)))
	default:
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err := cmd.Err()
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		w.ran[sha] = true
	case !redis.HasErrorPrefix(err, "NOSCRIPT"):
		w.failed = append(w.failed, fmt.Sprintf("%s: %v", sha, err))
	}
}

func (w *scriptWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ran)
}

func (w *scriptWatch) failures() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}
