package idempotency

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// A token spent before it expired is answered from its record after: the
// resubmitted form gets the order it placed, never "not found" (which
// tells the user nothing happened, and they order again). From this
// process's memory, and from Redis alike.
func TestSpentTokenPastItsExpiryReplays(t *testing.T) {
	for name, opts := range map[string][]Option{
		"from memory": nil,
		"from redis":  {WithResponseCache(0, 0)},
	} {
		t.Run(name, func(t *testing.T) {
			s := newShop(t, append([]Option{WithTokenTTL(300 * time.Millisecond)}, opts...)...)
			c := s.client()
			tok := s.token(c)
			first := s.post(c, "/orders", tok, `{"sku":"tea"}`)
			require.Equal(t, http.StatusCreated, first.status)
			time.Sleep(400 * time.Millisecond)

			again := s.post(c, "/orders", tok, `{"sku":"tea"}`)
			require.Equal(t, http.StatusCreated, again.status, again.body)
			require.Equal(t, "true", again.header.Get(ReplayedHeader))
			require.Equal(t, first.body, again.body)
			requireProblem(t, s.post(c, "/orders", tok, `{"sku":"coffee"}`), 422, "key-reused")
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// A double click that arrives after the token expired, while the first
// submission still runs (on another instance), waits for it and gets its
// answer instead of a refusal.
func TestExpiredTokenWaitsForItsRun(t *testing.T) {
	s := newShop(t, WithTokenTTL(200*time.Millisecond))
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
	release := make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		<-release
		s.defaultHandler(w, r)
	}
	c := s.client()
	tok := s.token(c)
	firstDone := make(chan answer)
	go func() { firstDone <- s.post(c, "/orders", tok, `{}`) }()
	time.Sleep(300 * time.Millisecond) // the token expires while its order runs

	// The other instance shares the session cookie (same host) and the secret in Redis.
	duplicate := make(chan answer)
	go func() { duplicate <- other.post(c, "/orders", tok, `{}`) }()
	time.Sleep(100 * time.Millisecond)
	close(release)
	first := <-firstDone
	dup := <-duplicate
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, http.StatusCreated, dup.status, dup.body)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.Equal(t, first.body, dup.body)
	require.EqualValues(t, 1, s.execs.Load()+other.execs.Load())
}

// A browser sends every cookie of the session name whose domain and path
// match, and a planted one (a sibling subdomain's, or a more specific
// path's) comes first: a token issued to the genuine session is still
// accepted, and one issued to the planted one too (it is the same
// browser's).
func TestPlantedSessionCookieDoesNotDisableTokens(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	genuine := c.Jar.Cookies(mustURL(t, s.srv.URL))[0].Value
	for name, planted := range map[string]string{
		"valid session": "0f9e8d7c-6b5a-4c3d-9e1f-2a3b4c5d6e7f",
		"malformed":     "attacker",
	} {
		t.Run(name, func(t *testing.T) {
			tok := s.token(c)
			req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader(`{}`))
			require.NoError(t, err)
			req.Header.Set(KeyHeader, tok)
			req.Header.Set("Cookie", "idempotency_session="+planted+"; idempotency_session="+genuine)
			a := do(t, s.srv.Client(), req)
			require.Equal(t, http.StatusCreated, a.status, a.body)
		})
	}
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
}

// The token endpoint never replaces a session cookie it did not create:
// WithSessionCookie may name the application's own login cookie, whose
// value (not a UUID) is a scope of its own; replacing it would log the
// user out.
func TestAppSessionCookieIsNeverOverwritten(t *testing.T) {
	s := newShop(t, WithSessionCookie("app_session"))
	for _, value := range []string{"signed.login.session", "0f9e8d7c-6b5a-4c3d-9e1f-2a3b4c5d6e7f"} {
		req := httptest.NewRequest(http.MethodGet, "/idempotency/token", nil)
		req.Header.Set("Cookie", "app_session="+value)
		w := httptest.NewRecorder()
		s.idem.TokenHandler().ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code)
		require.Empty(t, w.Result().Cookies(), "the caller's own cookie stays")
	}

	c := s.client()
	c.Jar.SetCookies(mustURL(t, s.srv.URL), []*http.Cookie{{Name: "app_session", Value: "alice.login", Path: "/"}})
	tok := s.token(c)
	require.Equal(t, "alice.login", c.Jar.Cookies(mustURL(t, s.srv.URL))[0].Value)
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)

	bob := s.client()
	bob.Jar.SetCookies(mustURL(t, s.srv.URL), []*http.Cookie{{Name: "app_session", Value: "bob.login", Path: "/"}})
	requireProblem(t, s.post(bob, "/orders", tok, `{}`), 422, "token-not-found")
	require.EqualValues(t, 1, s.execs.Load())
}

// A session layer outside the token endpoint that starts the
// application's session on a first visit sets its cookie on the response,
// before the endpoint runs: the token is bound to that session, and the
// endpoint adds no cookie of the name, which would replace the
// application's in the browser and log the visitor out.
func TestASessionStartedOnTheSameResponseIsTheTokensScope(t *testing.T) {
	s := newShop(t, WithSessionCookie("app_session"))
	var started atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("/idempotency/token", s.idem.TokenHandler())
	mux.Handle("POST /orders", s.idem.Protect(http.HandlerFunc(s.count)))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := r.Cookie("app_session"); err != nil {
			http.SetCookie(w, &http.Cookie{Name: "app_session", Value: fmt.Sprintf("login-%d.signed", started.Add(1)),
				Path: "/", HttpOnly: true})
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)

	alice := s.client()
	resp, err := alice.Get(s.srv.URL + "/idempotency/token")
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, resp.Cookies(), 1, "the application's cookie alone")
	require.Equal(t, "login-1.signed", alice.Jar.Cookies(mustURL(t, s.srv.URL))[0].Value)
	tok := s.token(alice) // a second token, for the session the jar now holds
	require.Equal(t, http.StatusCreated, s.post(alice, "/orders", tok, `{}`).status)
	require.Equal(t, "login-1.signed", alice.Jar.Cookies(mustURL(t, s.srv.URL))[0].Value, "the session lasted")

	bob := s.client()
	requireProblem(t, s.post(bob, "/orders", tok, `{}`), 422, "token-not-found")
	require.EqualValues(t, 1, s.execs.Load())
	require.EqualValues(t, 2, started.Load(), "alice's session, then bob's")

	// The first visit's token itself is the session's, as the form a
	// first page carries is.
	carol := s.client()
	first := s.token(carol)
	require.Equal(t, http.StatusCreated, s.post(carol, "/orders", first, `{}`).status)
	require.EqualValues(t, 2, s.execs.Load())
}

// A prefixed session cookie is always sent Secure (__Host-: Path=/, no
// Domain), also when TLS ended at a proxy and the request reached the
// application over plain HTTP: browsers refuse it otherwise, and no
// session would ever stick. A configuration that says otherwise is
// refused at New.
func TestPrefixedSessionCookieIsAlwaysSecure(t *testing.T) {
	for _, name := range []string{"__Host-idem", "__Secure-idem"} {
		s := newShop(t, WithSessionCookie(name))
		w := httptest.NewRecorder()
		s.idem.TokenHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://shop.example/idempotency/token", nil))
		cookies := w.Result().Cookies()
		require.Len(t, cookies, 1)
		require.True(t, cookies[0].Secure, name)
		require.Equal(t, "/", cookies[0].Path)
		require.Empty(t, cookies[0].Domain)

		require.Panics(t, func() { New(s.rdb, WithSessionCookie(name), WithSecureCookie(false)) }, name)
	}
	require.Panics(t, func() { New(newShop(t).rdb, WithSessionCookie("bad name")) })
}

func mustURL(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u
}

// A request that repeats its session cookie thousands of times costs no
// more digests than a handful: values are tried once each, at most
// maxSessionCookies of them, and a genuine one among the first is found.
func TestRepeatedSessionCookiesAreTriedOnce(t *testing.T) {
	m := New(redistest.Client(t, "test-"+t.Name()), WithTokenKeys(TokenKeys{Sign: ringKey('k')}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Cookie", strings.Repeat("idempotency_session=a; ", 2700)+"idempotency_session=b")
	require.Equal(t, []string{sessionScope("a"), sessionScope("b")}, m.sessions(r))

	var many []string
	for i := range 100 {
		many = append(many, fmt.Sprintf("idempotency_session=v%d", i))
	}
	r.Header.Set("Cookie", strings.Join(many, "; "))
	require.Len(t, m.sessions(r), maxSessionCookies)
}
