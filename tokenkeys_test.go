package idempotency

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// ringKey is a 32-byte key made of one letter, for readable rings.
func ringKey(c byte) []byte { return bytes.Repeat([]byte{c}, 32) }

// A rotation done as docs/operations.md says: the new key is first
// accepted everywhere, then promoted, while instances of both steps serve
// side by side. Every token is spent once wherever it lands, and a token
// spent before the rotation replays after it.
func TestATokenKeyRotationKeepsEveryTokenGood(t *testing.T) {
	old, next := ringKey('o'), ringKey('n')
	s := newShop(t, WithTokenKeys(TokenKeys{Sign: old}))
	rdb, prefix := s.rdb, WithKeyPrefix(s.idem.cfg.prefix)
	c := s.client()
	spent := s.token(c)
	first := s.post(c, "/orders", spent, `{}`)
	require.Equal(t, http.StatusCreated, first.status)

	accepting := newShopOn(t, rdb, prefix, WithTokenKeys(TokenKeys{Sign: old, Accept: [][]byte{next}}))
	promoted := newShopOn(t, rdb, prefix, WithTokenKeys(TokenKeys{Sign: next, Accept: [][]byte{old}}))
	fromAccepting, fromPromoted := accepting.token(c), promoted.token(c)
	require.Equal(t, http.StatusCreated, promoted.post(c, "/orders", fromAccepting, `{}`).status)
	require.Equal(t, http.StatusCreated, accepting.post(c, "/orders", fromPromoted, `{}`).status)
	for _, tok := range []string{fromAccepting, fromPromoted} {
		for _, shop := range []*shop{accepting, promoted} {
			require.Equal(t, "true", shop.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader))
		}
	}
	again := promoted.post(c, "/orders", spent, `{}`)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	require.EqualValues(t, 3, s.execs.Load()+accepting.execs.Load()+promoted.execs.Load())
}

// A revocation, then a restart of every instance (issue: a form whose
// token was spent before the revocation must replay, and the token it
// would otherwise ask for must not order again). After it, a revoked
// key's spent token replays its answer; its unspent token is refused as
// unknown, runs nothing, and never will; and a new token orders once.
// Redis restarting empty in between changes nothing of this but the
// records it loses: no key lives in it.
func TestARevokedKeyStillReplaysItsSpentTokens(t *testing.T) {
	old, next := ringKey('o'), ringKey('n')
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	s := newShopOn(t, rdb, WithTokenKeys(TokenKeys{Sign: old}))
	c := s.client()
	spent, unspent := s.token(c), s.token(c)
	first := s.post(c, "/orders", spent, `{}`)
	require.Equal(t, http.StatusCreated, first.status)

	restarted := newShopOn(t, rdb, WithTokenKeys(TokenKeys{Sign: next, Revoked: [][]byte{old}}))
	again := restarted.post(c, "/orders", spent, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	for range 2 {
		requireProblem(t, restarted.post(c, "/orders", unspent, `{}`), 422, "token-not-found")
	}
	fresh := restarted.token(c)
	require.Equal(t, http.StatusCreated, restarted.post(c, "/orders", fresh, `{}`).status)
	require.EqualValues(t, 2, s.execs.Load()+restarted.execs.Load())

	require.NoError(t, srv.Signal(syscall.SIGKILL))
	redistest.Restart(t, srv)
	afterRestart := restarted.token(c)
	require.Eventually(t, func() bool {
		return restarted.post(c, "/orders", afterRestart, `{}`).status == http.StatusCreated
	}, 10*time.Second, 20*time.Millisecond, "a token issued before Redis restarted is still good after")
	requireProblem(t, restarted.post(c, "/orders", unspent, `{}`), 422, "token-not-found")
	require.EqualValues(t, 3, s.execs.Load()+restarted.execs.Load())
}

// An unknown, forged or foreign token is refused at once without Redis:
// here Redis is a closed port (asking it would answer 503), and 400 such
// forms at once, from as many sessions, are each answered 422.
func TestUnknownTokensAreRefusedAtOnceWithoutRedis(t *testing.T) {
	port, err := redistest.FreePort() // nothing listens there
	require.NoError(t, err)
	dead := redis.NewClient(&redis.Options{Addr: fmt.Sprint("127.0.0.1:", port), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { dead.Close() })
	m := New(dead, WithTokenKeys(TokenKeys{Sign: ringKey('k')}), WithStoreTimeout(2*time.Second),
		WithLogger(slog.New(slog.DiscardHandler)))
	foreign := New(dead, WithTokenKeys(TokenKeys{Sign: ringKey('f')}), WithLogger(slog.New(slog.DiscardHandler)))
	h := m.Protect(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
	var wg sync.WaitGroup
	statuses := make([]string, 400)
	for i := range statuses {
		wg.Go(func() {
			session := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			tok, err := foreign.IssueTokenFor(httptest.NewRequest(http.MethodGet, "/", nil), session)
			if err != nil {
				statuses[i] = err.Error()
				return
			}
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
			r.Header.Set(KeyHeader, tok.Value)
			r.AddCookie(&http.Cookie{Name: "idempotency_session", Value: session})
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			statuses[i] = fmt.Sprint(w.Code, " ", problemType(w.Body.String()))
		})
	}
	wg.Wait()
	for i, got := range statuses {
		require.Equal(t, "422 token-not-found", got, "form %d", i)
	}
}

// problemType is a problem body's type without its document: what follows
// #problem-.
func problemType(body string) string {
	_, after, _ := strings.Cut(body, "#problem-")
	typ, _, _ := strings.Cut(after, `"`)
	return typ
}

func encodeKey(key []byte) string { return base64.RawURLEncoding.EncodeToString(key) }

// No secret lives in Redis: after tokens were issued, spent, replayed and
// refused, no key of the prefix holds any key of the ring.
func TestNoTokenKeyIsWrittenToRedis(t *testing.T) {
	sign := ringKey('s')
	s := newShop(t, WithTokenKeys(TokenKeys{Sign: sign}))
	c := s.client()
	tok := s.token(c)
	s.post(c, "/orders", tok, `{}`)
	s.post(c, "/orders", tok, `{}`)
	s.post(c, "/orders", "forged", `{}`)
	keys, err := s.rdb.Keys(t.Context(), s.idem.cfg.prefix+"*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	for _, k := range keys {
		require.NotContains(t, k, "secret")
		dump, err := s.rdb.Dump(t.Context(), k).Result()
		require.NoError(t, err)
		require.NotContains(t, dump, string(sign), k)
	}
}

// Instances that sign with keys the others lack are told at start-up, once:
// the second instance's Protect logs the first one's key as foreign. One
// given the same ring says nothing, nor does one whose ring holds the
// other's key.
func TestInstancesThatDoNotShareTheirKeyAreLogged(t *testing.T) {
	prefix := "test-" + t.Name()
	rdb := redistest.Client(t, prefix)
	logged := func(keys TokenKeys) string {
		var logs syncbuf.Buffer
		m := New(rdb, WithKeyPrefix(prefix), WithTokenKeys(keys), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		m.Protect(http.NotFoundHandler())
		m.Protect(http.NotFoundHandler()) // once, whatever the routes
		_, err := m.IssueTokenFor(httptest.NewRequest(http.MethodGet, "/", nil), "u")
		require.NoError(t, err)
		<-m.signers.checked // the check runs in the background
		return logs.String()
	}
	a, b := ringKey('a'), ringKey('b')
	require.NotContains(t, logged(TokenKeys{Sign: a}), "level=ERROR")
	require.NotContains(t, logged(TokenKeys{Sign: a}), "level=ERROR")
	require.NotContains(t, logged(TokenKeys{Sign: b, Accept: [][]byte{a}}), "level=ERROR")
	third := logged(TokenKeys{Sign: ringKey('c')})
	require.Equal(t, 1, strings.Count(third, "level=ERROR"), third)
	require.Contains(t, third, "key(s) this instance's ring lacks")
	require.NotContains(t, third, string(a))
}

// Without a ring, token mode warns at wiring that the key is random, once;
// a Middleware used only in key mode does not.
func TestARandomKeyIsWarnedAboutOnce(t *testing.T) {
	rdb := redistest.Client(t, "test-"+t.Name())
	var logs syncbuf.Buffer
	m := New(rdb, WithKeyPrefix("test-"+t.Name()), WithCallerCredentials(), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	m.ProtectKey(http.NotFoundHandler())
	require.NotContains(t, logs.String(), "random key")
	m.Protect(http.NotFoundHandler())
	m.Protect(http.NotFoundHandler())
	require.Equal(t, 1, strings.Count(logs.String(), "random key"), logs.String())
}

func TestTokenKeyRingsAreValidatedAtNew(t *testing.T) {
	rdb := redistest.Client(t, "test-"+t.Name())
	for name, keys := range map[string]TokenKeys{
		"short sign":       {Sign: []byte("short")},
		"no sign":          {Accept: [][]byte{ringKey('a')}},
		"short revoked":    {Sign: ringKey('s'), Revoked: [][]byte{[]byte("x")}},
		"sign accepted":    {Sign: ringKey('s'), Accept: [][]byte{ringKey('s')}},
		"accepted+revoked": {Sign: ringKey('s'), Accept: [][]byte{ringKey('a')}, Revoked: [][]byte{ringKey('a')}},
		"empty":            {},
	} {
		require.Panics(t, func() { New(rdb, WithTokenKeys(keys)) }, name)
	}
	require.Panics(t, func() { New(rdb, WithTokenSecret(nil)) }, "a secret that failed to load")
	require.Panics(t, func() { New(rdb, WithTokenSecret(make([]byte, 31))) })
	require.NotPanics(t, func() { New(rdb, WithTokenSecret(make([]byte, 32))) })
}

func TestParseTokenKeys(t *testing.T) {
	a, b, c := NewTokenKey(), NewTokenKey(), NewTokenKey()
	ring, err := ParseTokenKeys(" sign=" + a + "\taccept=" + b + " revoked=" + c + "= ")
	require.NoError(t, err)
	require.Equal(t, a, encodeKey(ring.Sign))
	require.Len(t, ring.Accept, 1)
	require.Equal(t, b, encodeKey(ring.Accept[0]))
	require.Len(t, ring.Revoked, 1)
	std := "sign=" + strings.NewReplacer("-", "+", "_", "/").Replace(a)
	got, err := ParseTokenKeys(std)
	require.NoError(t, err, "standard base64 too")
	require.Equal(t, ring.Sign, got.Sign)

	stdB := base64.StdEncoding.EncodeToString(ring.Accept[0]) // padded, as base64 tools print it
	for _, bad := range []string{
		"", "accept=" + a, "sign=" + a + " sign=" + b, "sign=!!!", "sign=" + a + " other=" + b,
		"sign=" + a + " " + b, "sign=c2hvcnQ", "sign=" + a + " revoked=" + a,
		"sign=" + a + " " + stdB, // a role forgotten before a padded key
		"sign=" + a + " " + b + "=junk!", "sign:" + b,
	} {
		_, err := ParseTokenKeys(bad)
		require.Error(t, err, bad)
		for _, key := range []string{b, stdB} {
			require.NotContains(t, err.Error(), key[:6], "an error never echoes a key, not even in part: %v", err)
		}
	}
}
