package idempotency

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestFirstRequestRunsHandlerAndDuplicateReplays(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)

	first := s.post(c, "/orders", tok, `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, `{"execution":1}`, first.body)
	require.Equal(t, "/orders/1", first.header.Get("Location"))
	require.NotEmpty(t, first.header.Values("Set-Cookie"), "the original answer keeps its cookie")
	require.Empty(t, first.header.Get(ReplayedHeader))

	for range 3 {
		dup := s.post(c, "/orders", tok, `{"item":"tea"}`)
		require.Equal(t, http.StatusCreated, dup.status)
		require.Equal(t, first.body, dup.body)
		require.Equal(t, "/orders/1", dup.header.Get("Location"))
		require.Equal(t, "application/json", dup.header.Get("Content-Type"))
		require.Equal(t, `{"item":"tea"}`, dup.header.Get("X-Request-Body"), "the handler saw the whole body")
		require.Equal(t, "true", dup.header.Get(ReplayedHeader))
		require.Empty(t, dup.header.Values("Set-Cookie"), "Set-Cookie is never replayed by default")
	}
	require.EqualValues(t, 1, s.execs.Load())
	require.Empty(t, keysWithoutTTL(t, s.rdb, "test-"+t.Name()))
}

func TestRejections(t *testing.T) {
	s := newShop(t)
	owner, stranger := s.client(), s.client()
	tok := s.token(owner)
	s.token(stranger) // the stranger has a session of its own

	tests := []struct {
		name   string
		client *http.Client
		key    string
		body   string
		status int
		slug   string
	}{
		{"no token", owner, "", `{}`, 400, "missing-key"},
		{"CR LF in key", owner, "", `{}`, 400, "invalid-key"}, // set below: net/http refuses CR LF in headers
		{"oversized key", owner, strings.Repeat("k", 256), `{}`, 400, "invalid-key"},
		{"unknown token", owner, "3f1e2d4c-5b6a-4789-8abc-def012345678", `{}`, 422, "token-not-found"},
		{"malformed token", owner, "not-a-token", `{}`, 422, "token-not-found"},
		{"another session's token", stranger, tok, `{}`, 422, "token-not-found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a answer
			if tc.name == "CR LF in key" {
				a = s.postForm(tc.client, "/orders", "idempotency_token=a%0D%0Ab")
			} else {
				a = s.post(tc.client, "/orders", tc.key, tc.body)
			}
			requireProblem(t, a, tc.status, tc.slug)
		})
	}
	require.Zero(t, s.execs.Load())

	// The stranger's attempt did not spend the owner's token.
	require.Equal(t, http.StatusCreated, s.post(owner, "/orders", tok, `{}`).status)
	require.EqualValues(t, 1, s.execs.Load())
}

func (s *shop) postForm(c *http.Client, path, form string) answer {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(form))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return do(s.t, c, req)
}

func TestUnknownAndForeignTokensAnswerAlike(t *testing.T) {
	s := newShop(t)
	owner, stranger := s.client(), s.client()
	tok := s.token(owner)
	s.token(stranger)
	unknown := s.post(stranger, "/orders", "3f1e2d4c-5b6a-4789-8abc-def012345678", `{}`)
	foreign := s.post(stranger, "/orders", tok, `{}`)
	require.Equal(t, unknown.status, foreign.status)
	require.Equal(t, unknown.body, foreign.body)
	require.Equal(t, unknown.header.Get("Content-Type"), foreign.header.Get("Content-Type"))
}

// A token that expired unspent is refused with a problem of its own: the
// user is told to take a new one, and nothing ran.
func TestExpiredTokenIsRejected(t *testing.T) {
	s := newShop(t, WithTokenTTL(50*time.Millisecond))
	c := s.client()
	tok := s.token(c)
	time.Sleep(120 * time.Millisecond)
	requireProblem(t, s.post(c, "/orders", tok, `{}`), 422, "token-expired")
	require.Zero(t, s.execs.Load())
}

func TestSameTokenDifferentRequestIsRefused(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{"qty":1}`).status)
	requireProblem(t, s.post(c, "/orders", tok, `{"qty":2}`), 422, "key-reused")

	// Key mode: the same key on another body.
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "pay-1", `{"amount":5}`).status)
	requireProblem(t, s.post(c, "/payments", "pay-1", `{"amount":6}`), 422, "key-reused")
	require.EqualValues(t, 2, s.execs.Load())
}

func TestKeyModeAnonymousCallersShareTheRoute(t *testing.T) {
	s := newShop(t)
	alice, bob := s.client(), s.client()
	first := s.post(alice, "/payments", "order-42", `{"amount":5}`)
	require.Equal(t, http.StatusCreated, first.status)
	// Callers that name nobody (no session, no Authorization) share the
	// route's keys: the same key gets the same answer.
	again := s.post(bob, "/payments", "order-42", `{"amount":5}`)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
}

func TestKeyModeWithScopeFunctionKeepsClientsApart(t *testing.T) {
	s := newShop(t, WithScope(func(r *http.Request) (string, error) {
		if id := r.Header.Get("X-Client"); id != "" {
			return id, nil
		}
		return "", http.ErrNoCookie
	}))
	c := s.client()
	send := func(client string) answer {
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "k1")
		if client != "" {
			req.Header.Set("X-Client", client)
		}
		return do(t, c, req)
	}
	require.Equal(t, `{"execution":1}`, send("a").body)
	require.Equal(t, `{"execution":2}`, send("b").body)
	require.Equal(t, `{"execution":1}`, send("a").body)
	requireProblem(t, send(""), 401, "no-scope")
	require.EqualValues(t, 2, s.execs.Load())
}

func TestDuplicateWhileRunningWaitsThenReplays(t *testing.T) {
	for _, sameInstance := range []bool{true, false} {
		name := map[bool]string{true: "same instance", false: "other instance"}[sameInstance]
		t.Run(name, func(t *testing.T) {
			s := newShop(t)
			other := s
			if !sameInstance {
				other = newShopOn(t, s.rdb, WithKeyPrefix("test-"+strings.ReplaceAll(t.Name(), "/", "-")))
				other.handler = s.defaultHandler
			}
			release := make(chan struct{})
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				<-release
				s.defaultHandler(w, r)
			}
			c := s.client()
			firstDone := s.postAsync(c, "/payments", "slow", `{}`)
			require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
			dupDone := other.postAsync(c, "/payments", "slow", `{}`)
			time.Sleep(50 * time.Millisecond)
			close(release)
			dup := (<-dupDone).must(t)
			first := (<-firstDone).must(t)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, first.body, dup.body)
			require.Equal(t, "true", dup.header.Get(ReplayedHeader))
			require.EqualValues(t, 1, executions(s, other))
		})
	}
}

// executions counts the handler runs of one or two distinct shops.
func executions(a, b *shop) int64 {
	if a == b {
		return a.execs.Load()
	}
	return a.execs.Load() + b.execs.Load()
}

func TestDuplicatePastWaitBoundGets409(t *testing.T) {
	for _, sameInstance := range []bool{true, false} {
		t.Run(map[bool]string{true: "same instance", false: "other instance"}[sameInstance], func(t *testing.T) {
			s := newShop(t, WithWaitTimeout(100*time.Millisecond))
			other := s
			if !sameInstance {
				other = newShopOn(t, s.rdb, WithWaitTimeout(100*time.Millisecond),
					WithKeyPrefix("test-"+strings.ReplaceAll(t.Name(), "/", "-")))
			}
			release := make(chan struct{})
			s.handler = func(w http.ResponseWriter, r *http.Request) { <-release; s.defaultHandler(w, r) }
			c := s.client()
			done := s.postAsync(c, "/payments", "slow", `{}`)
			require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
			start := time.Now()
			dup := other.post(c, "/payments", "slow", `{}`)
			close(release)
			(<-done).must(t)
			requireProblem(t, dup, http.StatusConflict, "in-progress")
			require.Equal(t, "3", dup.header.Get("Retry-After"), "one lease, the default 3 s")
			require.GreaterOrEqual(t, time.Since(start), 90*time.Millisecond, "it waited before giving up")
			require.EqualValues(t, 1, executions(s, other))
		})
	}
}

// deadRedis is a client for an address where nothing listens.
func deadRedis(t *testing.T) *redis.Client {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { dead.Close() })
	return dead
}

// httpRequestKey is a key-mode request for the test shop's /payments.
func httpRequestKey(t *testing.T, key string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set(KeyHeader, key)
	return req
}

func TestRedisUnavailableFailsClosed(t *testing.T) {
	s := newShopOn(t, deadRedis(t), WithStoreTimeout(200*time.Millisecond))
	c := s.client()
	a := s.post(c, "/payments", "k", `{}`)
	requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
	require.Equal(t, "1", a.header.Get("Retry-After"))
	require.NotContains(t, a.body, "127.0.0.1", "no internal error text reaches the client")
	require.NotContains(t, a.body, "refused")
	require.Zero(t, s.execs.Load())

	// Tokens are still issued, from the configured keys; spending one
	// fails closed like any claim.
	tok := s.token(c)
	requireProblem(t, s.post(c, "/orders", tok, `{}`), http.StatusServiceUnavailable, "store-unavailable")
	require.Zero(t, s.execs.Load())

	// Malformed keys are refused before Redis is asked.
	requireProblem(t, s.post(c, "/payments", strings.Repeat("x", 300), `{}`), 400, "invalid-key")
}

func TestFailOpenRunsHandlerWithoutRedis(t *testing.T) {
	s := newShopOn(t, deadRedis(t), WithFailOpen(), WithStoreTimeout(200*time.Millisecond))
	require.Equal(t, http.StatusCreated, s.post(s.client(), "/payments", "k", `{}`).status)
	require.EqualValues(t, 1, s.execs.Load())
}

func TestServerErrorsAreStoredUnlessReleased(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(map[bool]string{false: "stored", true: "released"}[release], func(t *testing.T) {
			var opts []Option
			if release {
				opts = append(opts, WithReleaseOnServerError())
			}
			s := newShop(t, opts...)
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				if s.execs.Load() == 1 {
					http.Error(w, "upstream down", http.StatusBadGateway)
					return
				}
				s.defaultHandler(w, r)
			}
			c := s.client()
			tok := s.token(c)
			require.Equal(t, http.StatusBadGateway, s.post(c, "/orders", tok, `{}`).status)
			again := s.post(c, "/orders", tok, `{}`)
			if release {
				require.Equal(t, http.StatusCreated, again.status, "the token came back for a retry")
				require.EqualValues(t, 2, s.execs.Load())
			} else {
				require.Equal(t, http.StatusBadGateway, again.status)
				require.Equal(t, "true", again.header.Get(ReplayedHeader))
				require.EqualValues(t, 1, s.execs.Load())
			}
		})
	}
}

func TestPanicReleasesKeyAndPropagates(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if s.execs.Load() == 1 {
			panic("boom")
		}
		s.defaultHandler(w, r)
	}
	// Call the protected handler directly so the panic reaches the test.
	h := s.idem.Protect(http.HandlerFunc(s.count))
	req := httpRequest(t, s, c, tok)
	require.PanicsWithValue(t, "boom", func() { h.ServeHTTP(discard{}, req) })

	// Nothing was stored: the retry runs and succeeds, once.
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	require.Equal(t, "true", s.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 2, s.execs.Load())
}

// httpRequest builds a server-side request carrying c's session cookie.
func httpRequest(t *testing.T, s *shop, c *http.Client, tok string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	for _, ck := range c.Jar.Cookies(req.URL) {
		req.AddCookie(ck)
	}
	req.Header.Set(KeyHeader, tok)
	return req
}

type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}

func TestClientDisconnectStillStoresTheAnswer(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	started, finished := make(chan struct{}, 1), make(chan error, 1)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		time.Sleep(200 * time.Millisecond) // the client gives up meanwhile
		finished <- r.Context().Err()
		s.defaultHandler(w, r)
	}
	req := httpRequest(t, s, c, tok)
	// The client gives up once the handler runs: a timeout of its own could
	// run out before the request even reached the server on a loaded
	// machine, and then no handler would ever finish.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-started:
		case <-ctx.Done():
		}
		cancel()
	}()
	_, err := c.Do(req.WithContext(ctx))
	require.Error(t, err, "the first POST was aborted")
	require.NoError(t, <-finished, "the handler's context outlived the client")

	var retry answer
	require.Eventually(t, func() bool {
		retry = s.post(c, "/orders", tok, `{}`)
		return retry.status == http.StatusCreated
	}, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
}

func TestStreamedAndOversizedResponsesAreNotReplayed(t *testing.T) {
	tests := map[string]http.HandlerFunc{
		"flushed": func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("part one "))
			http.NewResponseController(w).Flush()
			w.Write([]byte("part two"))
		},
		"oversized": func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(strings.Repeat("x", 2048)))
		},
	}
	for name, handler := range tests {
		t.Run(name, func(t *testing.T) {
			s := newShop(t, WithMaxResponseBytes(1024))
			s.handler = handler
			c := s.client()
			first := s.post(c, "/payments", "k", `{}`)
			require.Equal(t, http.StatusOK, first.status)
			require.NotEmpty(t, first.body, "the first caller gets the full response")
			if name == "flushed" {
				require.Equal(t, "part one part two", first.body)
			} else {
				require.Len(t, first.body, 2048)
			}
			requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "not-replayable")
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	a := newShop(t)
	b := newShopOn(t, a.rdb, WithKeyPrefix("test-"+t.Name()))
	b.handler = a.handler
	slow := func(s *shop) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond)
			s.defaultHandler(w, r)
		}
	}
	a.handler, b.handler = slow(a), slow(a)
	c := a.client()
	const tokens, perToken = 5, 100
	for range tokens {
		tok := a.token(c)
		answers := make([]<-chan asyncAnswer, perToken)
		for i := range perToken {
			s := a
			if i%2 == 1 {
				s = b // two instances behind one Redis
			}
			answers[i] = s.postAsync(c, "/orders", tok, `{"n":1}`)
		}
		var bodies []string
		for _, pending := range answers {
			ans := (<-pending).must(t)
			require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, ans.status, ans.body)
			if ans.status == http.StatusCreated {
				bodies = append(bodies, ans.body)
			}
		}
		require.NotEmpty(t, bodies)
		for _, body := range bodies {
			require.Equal(t, bodies[0], body, "every answer is the one execution's")
		}
	}
	require.EqualValues(t, tokens, a.execs.Load()+b.execs.Load())
	t.Logf("%d tokens × %d concurrent requests on 2 instances: %d executions", tokens, perToken, a.execs.Load()+b.execs.Load())
}
