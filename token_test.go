package idempotency

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestTokenEndpointStartsSession(t *testing.T) {
	s := newShop(t)
	resp, err := http.Get(s.srv.URL + "/idempotency/token")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	cookies := resp.Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, "idempotency_session", ck.Name)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteLaxMode, ck.SameSite)
	require.False(t, ck.Secure, "plain HTTP")
	require.True(t, isSession(ck.Value))

	// Under TLS the cookie is Secure; a caller with a session keeps it.
	r := httptest.NewRequest(http.MethodGet, "/idempotency/token", nil)
	r.TLS = &tls.ConnectionState{}
	w := httptest.NewRecorder()
	s.idem.TokenHandler().ServeHTTP(w, r)
	require.True(t, w.Result().Cookies()[0].Secure)

	c := s.client()
	s.token(c)
	resp, err = c.Get(s.srv.URL + "/idempotency/token")
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, resp.Cookies(), "an existing session is reused")

	resp, err = http.Post(s.srv.URL+"/idempotency/token", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestFormFieldSharesOneSessionPerRequest(t *testing.T) {
	s := newShop(t)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	first, err := s.idem.FormField(w, r)
	require.NoError(t, err)
	second, err := s.idem.FormField(w, r)
	require.NoError(t, err)
	require.Len(t, w.Result().Cookies(), 1, "two forms on one page, one new session")
	require.Regexp(t, `^<input type="hidden" name="idempotency_token" value="[A-Za-z0-9_-]{54}">$`, string(first))
	require.NotEqual(t, first, second)

	// Both tokens work from the browser that got the page.
	c := s.client()
	u := s.srv.URL + "/"
	req := httptest.NewRequest(http.MethodGet, u, nil)
	c.Jar.SetCookies(req.URL, w.Result().Cookies())
	for _, field := range []string{string(first), string(second)} {
		tok := field[strings.Index(field, `value="`)+7 : len(field)-2]
		require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	}
	require.EqualValues(t, 2, s.execs.Load())
}

// An issued token is spent once: its record marks it spent for longer
// than the token lives. Forged and another session's tokens are refused
// alike, without asking Redis; one that expired unspent, as expired.
func TestTokensAreSignedAndSpentOnce(t *testing.T) {
	s := newShop(t, WithTokenTTL(time.Second), WithResponseCache(0, 0))
	c, other := s.client(), s.client()
	tok := s.token(c)
	s.token(other)
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	require.Equal(t, "true", s.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader))
	requireProblem(t, s.post(other, "/orders", tok, `{}`), 422, "token-not-found")

	forged := []byte(s.token(c))
	forged[len(forged)-1] ^= 1 // the last character carries MAC bits
	requireProblem(t, s.post(c, "/orders", string(forged), `{}`), 422, "token-not-found")

	old := s.token(c)
	time.Sleep(1100 * time.Millisecond)
	requireProblem(t, s.post(c, "/orders", old, `{}`), 422, "token-expired")

	// Another key signs other tokens.
	m := New(s.rdb, WithKeyPrefix("test-"+t.Name()), WithTokenSecret([]byte(strings.Repeat("k", 32))))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	foreign, err := m.IssueTokenFor(r, sessionOf(t, s, c))
	require.NoError(t, err)
	requireProblem(t, s.post(c, "/orders", foreign.Value, `{}`), 422, "token-not-found")
	require.EqualValues(t, 1, s.execs.Load())
}

// Every Middleware of a process given no key shares the process's: one
// accepts the tokens another issued.
func TestMiddlewaresOfAProcessShareItsRandomKey(t *testing.T) {
	a, b := twoInstances(t)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	tok, err := a.IssueTokenFor(r, "s")
	require.NoError(t, err)
	require.Equal(t, tokenValid, b.tokens.check("s", tok.Value).state)
}

func sessionOf(t *testing.T, s *shop, c *http.Client) string {
	req := httptest.NewRequest(http.MethodGet, s.srv.URL, nil)
	for _, ck := range c.Jar.Cookies(req.URL) {
		if ck.Name == "idempotency_session" {
			return ck.Value
		}
	}
	t.Fatal("no session cookie")
	return ""
}

func TestIssuedTokensAreUnique(t *testing.T) {
	s := newShop(t)
	seen := make(map[string]bool)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for i := range 2000 {
		tok, err := s.idem.IssueTokenFor(r, fmt.Sprint("scope-", i%50))
		require.NoError(t, err)
		require.Len(t, tok.Value, tokenLength)
		require.False(t, seen[tok.Value])
		seen[tok.Value] = true
	}
}

func TestInvalidConfigurationPanicsAtConstruction(t *testing.T) {
	rdb := newShop(t).rdb
	for name, opt := range map[string]Option{
		"brace in prefix": WithKeyPrefix("a{b}"),
		"tiny lease":      WithLockLease(10),
		"negative wait":   WithWaitTimeout(-1),
		"short secret":    WithTokenSecret([]byte("short")),
		"huge keys":       WithMaxKeyLength(1 << 20),
	} {
		require.Panics(t, func() { New(rdb, opt) }, name)
	}
	require.Panics(t, func() { New(nil) })
}

func TestIsSessionAcceptsOnlyTheCanonicalForm(t *testing.T) {
	tok := uuid.NewString() // as issuingScope draws a session
	require.True(t, isSession(tok))
	for _, bad := range []string{
		strings.ToUpper(tok), "{" + tok + "}", "urn:uuid:" + tok, strings.ReplaceAll(tok, "-", ""),
		tok[:35] + "g", tok[:8] + "x" + tok[9:], "",
	} {
		require.False(t, isSession(bad), bad)
	}
}

// A token has one spelling: the unused bits of its last character must be
// zero, or the 16 spellings of one token would be 16 records, each spent
// once.
func TestATokenHasOneSpelling(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, tok[len(tok)-1])
	require.Zero(t, last&15, "an issued token's spare bits are zero")
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	for low := 1; low < 16; low++ {
		other := tok[:len(tok)-1] + string(alphabet[last|low])
		requireProblem(t, s.post(c, "/orders", other, `{}`), 422, "token-not-found")
	}
	require.EqualValues(t, 1, s.execs.Load())
}

// Two middlewares that share a token secret under two key prefixes keep
// apart which tokens they spend: neither accepts the other's.
func TestATokenBelongsToItsKeyPrefix(t *testing.T) {
	secret := WithTokenSecret([]byte(strings.Repeat("s", 32)))
	rdb := newShop(t).rdb
	a := New(rdb, WithKeyPrefix("test-"+t.Name()+"-a"), secret)
	b := New(rdb, WithKeyPrefix("test-"+t.Name()+"-b"), secret)
	tok, err := a.IssueTokenFor(httptest.NewRequest(http.MethodGet, "/", nil), "u1")
	require.NoError(t, err)
	require.Equal(t, tokenValid, a.tokens.check("u1", tok.Value).state)
	require.Equal(t, tokenInvalid, b.tokens.check("u1", tok.Value).state)
}

// 10⁵ random, well-formed tokens (an expiry in the future, random nonce
// and MAC) probed against a session that holds 32 real ones: none is
// accepted, and none spends a real token. Under the application's own
// secret, which cannot move, each is refused at once; under a shared one
// each would wait for the next read of the fleet's secrets (refresh).
func TestRandomTokenProbesNeverHit(t *testing.T) {
	s := newShop(t, WithTokenSecret([]byte("the application's own secret, 32 bytes or more")))
	c := s.client()
	var real []string
	for range 32 {
		real = append(real, s.token(c))
	}
	session := sessionOf(t, s, c)
	h := s.idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.execs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	n := trials(100_000, 1_000_000)
	var hits, rejected atomic.Int64
	var wg sync.WaitGroup
	per := n / 8
	for range 8 {
		wg.Go(func() {
			for range per {
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
				r.AddCookie(&http.Cookie{Name: "idempotency_session", Value: session})
				var b [tokenBytes]byte
				rand.Read(b[:])
				binary.BigEndian.PutUint64(b[:8], uint64(time.Now().Add(time.Hour).UnixMilli()))
				r.Header.Set(KeyHeader, base64.RawURLEncoding.EncodeToString(b[:]))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code == http.StatusUnprocessableEntity {
					rejected.Add(1)
				} else {
					hits.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d random token probes against a session holding 32 tokens: %d hits, %d rejected", 8*per, hits.Load(), rejected.Load())
	require.Zero(t, hits.Load())
	require.Zero(t, s.execs.Load())
	// Every real token still works.
	for _, tok := range real {
		require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	}
}

// startedCookie reads the session a response starts as a browser would
// keep it, at the path the middleware's own cookie would take.
func TestStartedCookie(t *testing.T) {
	past := time.Unix(0, 0).UTC().Format(http.TimeFormat)
	for _, c := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"none", nil, ""},
		{"another name", []string{"other=1; Path=/"}, ""},
		{"set", []string{"sid=abc; Path=/"}, "abc"},
		{"set twice, the last kept", []string{"sid=abc; Path=/", "sid=def; Path=/"}, "def"},
		{"removed", []string{"sid=abc; Path=/", "sid=; Path=/; Max-Age=0"}, ""},
		{"expired", []string{"sid=abc; Path=/; Expires=" + past}, ""},
		{"Max-Age over Expires", []string{"sid=abc; Path=/; Max-Age=3600; Expires=" + past}, "abc"},
		{"an old path cleared", []string{"sid=abc; Path=/", "sid=; Path=/old; Max-Age=0"}, "abc"},
		{"another path", []string{"sid=abc; Path=/", "sid=xyz; Path=/admin"}, "abc"},
		{"only another path", []string{"sid=xyz; Path=/admin"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, startedCookie(http.Header{"Set-Cookie": c.lines}, "sid"))
		})
	}
}
