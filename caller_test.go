package idempotency

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// caller is one way a request names who sent it, as a test sets it.
type caller func(r *http.Request, who string)

// schemes are the usual ways an API identifies its callers.
var schemes = map[string]caller{
	"authorization": func(r *http.Request, who string) { r.Header.Set("Authorization", "Bearer "+who) },
	"cookie":        func(r *http.Request, who string) { r.Header.Set("Cookie", "session="+who+"; theme=dark") },
	"api-key header": func(r *http.Request, who string) {
		r.Header.Set("X-Api-Key", "sk_"+who)
	},
	"tls client certificate": func(r *http.Request, who string) {
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Raw: []byte("certificate of " + who)}}}
	},
	"proxy user header": func(r *http.Request, who string) { r.Header.Set("X-Forwarded-User", who+"@example.com") },
	"query key":         func(r *http.Request, who string) { r.URL.RawQuery = "api_key=" + who },
}

// ignoringQuery fingerprints the body alone, as an app's own fingerprint
// may: the caller binding must hold without the fingerprint's help.
func ignoringQuery(r *http.Request, body []byte) []byte { return body }

// Whatever identifies its callers, a key-mode route configured with any of
// the ready-made caller rules that fit the scheme never gives one caller
// another's answer: Bob, sending Alice's key and body, either runs his own
// request or is refused with a problem; nothing is dropped without a word,
// and each caller's retry replays its own answer.
func TestKeyModeNeverAnswersAnotherCaller(t *testing.T) {
	rules := map[string]map[string][]Option{
		"authorization": {
			"credentials":     {WithCallerCredentials()},
			"scope by header": {WithScope(ScopeByHeader("Authorization"))},
		},
		"cookie": {"credentials": {WithCallerCredentials()}},
		"api-key header": {
			"credentials":     {WithCallerCredentials("X-Api-Key")},
			"scope by header": {WithScope(ScopeByHeader("x-api-key"))},
		},
		"tls client certificate": {
			"credentials":          {WithCallerCredentials()},
			"scope by certificate": {WithScope(ScopeByClientCertificate())},
		},
		"proxy user header": {
			"credentials":     {WithCallerCredentials("X-Forwarded-User")},
			"scope by header": {WithScope(ScopeByHeader("X-Forwarded-User"))},
		},
		"query key": {
			"credentials":                  {WithCallerCredentials()},
			"credentials, query not in fp": {WithCallerCredentials(), WithFingerprint(ignoringQuery)},
		},
	}
	for scheme, identify := range schemes {
		for rule, opts := range rules[scheme] {
			t.Run(scheme+"/"+rule, func(t *testing.T) {
				s := newShop(t, opts...)
				var runs atomic.Int64
				h := s.idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, "payment %d", runs.Add(1))
				}))
				send := func(who string) answer {
					req := httptest.NewRequest(http.MethodPost, "https://shop.example/payments", strings.NewReader(`{"amount":5}`))
					req.Header.Set(KeyHeader, "shared-key")
					identify(req, who)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					return answer{status: w.Code, header: w.Header(), body: w.Body.String()}
				}
				alice := send("alice")
				require.Equal(t, http.StatusCreated, alice.status)
				require.Equal(t, "payment 1", alice.body)

				bob := send("bob")
				require.NotEqual(t, alice.body, bob.body, "bob must never receive alice's answer")
				require.Empty(t, bob.header.Get(ReplayedHeader))
				switch bob.status {
				case http.StatusCreated: // his own request ran
					require.Equal(t, "payment 2", bob.body)
					require.EqualValues(t, 2, runs.Load())
					again := send("bob")
					require.Equal(t, bob.body, again.body, "bob's retry replays his own answer")
				default: // or it was refused, and said so
					requireProblem(t, bob, http.StatusUnprocessableEntity, "key-reused")
					require.EqualValues(t, 1, runs.Load())
				}
				again := send("alice")
				require.Equal(t, "true", again.header.Get(ReplayedHeader))
				require.Equal(t, alice.body, again.body, "alice's retry replays her own answer")
			})
		}
	}
}

// Key mode does not start without being told who its callers are: a
// route that guessed wrong would hand one caller's answer to another.
func TestProtectKeyNeedsACallerRule(t *testing.T) {
	rdb := newShop(t).rdb
	msg, _ := panicMessage(func() { New(rdb).ProtectKey(http.NotFoundHandler()) }).(string)
	require.Contains(t, msg, "WithCallerCredentials")
	for name, opt := range map[string]Option{
		"credentials": WithCallerCredentials(),
		"scope":       WithScope(ScopeByHeader("X-Api-Key")),
		"shared":      WithSharedKeys(),
	} {
		require.NotPanics(t, func() { New(rdb, opt).ProtectKey(http.NotFoundHandler()) }, name)
	}
	require.NotPanics(t, func() { New(rdb).Protect(http.NotFoundHandler()) }, "token mode has its session")
	require.Panics(t, func() { New(rdb, WithCallerCredentials("X Api Key")) }, "not a header name")
}

// WithSharedKeys says what it means: every caller shares the route's keys,
// and whoever presents one receives its answer.
func TestSharedKeysAnswerEveryCaller(t *testing.T) {
	s := newShop(t, WithSharedKeys())
	first := s.postAs("/payments", "hook-1", `{}`, "Authorization", "Bearer alice")
	require.Equal(t, http.StatusCreated, first.status)
	other := s.postAs("/payments", "hook-1", `{}`, "Authorization", "Bearer bob")
	require.Equal(t, "true", other.header.Get(ReplayedHeader))
	require.Equal(t, first.body, other.body)
	require.EqualValues(t, 1, s.execs.Load())
}

// The ready-made scopes refuse a request that lacks what names its caller,
// rather than put it in a scope of anonymous callers, and keep the
// credential itself out of the scope, which a WithScope user may log.
func TestReadyMadeScopes(t *testing.T) {
	s := newShop(t, WithScope(ScopeByHeader("X-Api-Key")))
	requireProblem(t, s.postAs("/payments", "k", `{}`), http.StatusUnauthorized, "no-scope")
	require.Equal(t, http.StatusCreated, s.postAs("/payments", "k", `{}`, "X-Api-Key", "sk_live_secret").status)

	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set("X-Api-Key", "sk_live_secret")
	scope, err := ScopeByHeader("X-Api-Key")(req)
	require.NoError(t, err)
	require.NotContains(t, scope, "sk_live_secret")

	_, err = ScopeByClientCertificate()(req)
	require.ErrorIs(t, err, ErrNoScope)
}

// A load balancer's sticky cookie renewed on every response changes a
// client's cookies between two tries: bound, the retry is refused
// key-reused; left out with WithIgnoredCookies, the retry replays. The
// cookies that remain still tell callers apart, and a request whose only
// cookie is ignored is one without cookies.
func TestIgnoredCookiesAreNoCredential(t *testing.T) {
	bound := newShop(t)
	ignoring := newShop(t, WithCallerCredentials(), WithIgnoredCookies("AWSALB"))
	first := bound.postAs("/payments", "k", `{}`, "Cookie", "session=alice; AWSALB=one")
	require.Equal(t, http.StatusCreated, first.status)
	requireProblem(t, bound.postAs("/payments", "k", `{}`, "Cookie", "session=alice; AWSALB=two"), 422, "key-reused")

	require.Equal(t, http.StatusCreated, ignoring.postAs("/payments", "k2", `{}`, "Cookie", "session=alice; AWSALB=one").status)
	again := ignoring.postAs("/payments", "k2", `{}`, "Cookie", "AWSALB=two; session=alice")
	require.Equal(t, "true", again.header.Get(ReplayedHeader), again.body)
	requireProblem(t, ignoring.postAs("/payments", "k2", `{}`, "Cookie", "session=bob; AWSALB=one"), 422, "key-reused")

	require.Equal(t, http.StatusCreated, ignoring.postAs("/payments", "anon", `{}`).status)
	anon := ignoring.postAs("/payments", "anon", `{}`, "Cookie", "AWSALB=three")
	require.Equal(t, "true", anon.header.Get(ReplayedHeader), anon.body)
}
