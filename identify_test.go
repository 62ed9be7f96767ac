package idempotency

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// postAs posts body with key to the shop's url (a path, or a whole URL),
// carrying the given header lines (name, value, name, value…) and no
// others: no cookie jar adds any.
func (s *shop) postAs(url, key, body string, header ...string) answer {
	s.t.Helper()
	if strings.HasPrefix(url, "/") {
		url = s.srv.URL + url
	}
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set(KeyHeader, key)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	return do(s.t, s.srv.Client(), req)
}

// In key mode two callers who send the same key and body never see each
// other's answer: whatever names the caller (Authorization, our session
// cookie, anyone's cookie) binds the request to it, and the second caller
// is refused as another request, without running.
func TestKeyScopeNeverCrossesCallers(t *testing.T) {
	for name, callers := range map[string][2][]string{
		"authorization": {{"Authorization", "Bearer alice"}, {"Authorization", "Bearer bob"}},
		"our session": {
			{"Cookie", "idempotency_session=7b0c4a52-1d7e-4c1e-9a55-6f7e8d9c0b1a"},
			{"Cookie", "idempotency_session=0f9e8d7c-6b5a-4c3d-9e1f-2a3b4c5d6e7f"}},
		"caller and anonymous": {{"Authorization", "Bearer alice"}, nil},
		"anonymous and caller": {nil, {"Cookie", "session=bob"}},
	} {
		t.Run(name, func(t *testing.T) {
			s := newShop(t)
			alice, bob := callers[0], callers[1]
			first := s.postAs("/payments", "shared-key", `{"amount":5}`, alice...)
			require.Equal(t, http.StatusCreated, first.status)
			stranger := s.postAs("/payments", "shared-key", `{"amount":5}`, bob...)
			requireProblem(t, stranger, http.StatusUnprocessableEntity, "key-reused")
			require.NotContains(t, stranger.body, "execution", "bob never gets alice's payment")
			again := s.postAs("/payments", "shared-key", `{"amount":5}`, alice...)
			require.Equal(t, first.body, again.body, "alice's own retry replays")
			require.Equal(t, "true", again.header.Get(ReplayedHeader))
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// An app's own session cookie (gorilla/sessions, scs), which the
// middleware knows nothing of, binds the request to its caller like ours:
// a second caller with the first one's key and body is refused, and the
// first caller's retry replays, whatever order its cookies come in.
func TestKeyModeAppSessionCookieBindsTheCaller(t *testing.T) {
	s := newShop(t)
	first := s.postAs("/payments", "order-42", `{"amount":5}`, "Cookie", "session=alice-secret; theme=dark")
	require.Equal(t, http.StatusCreated, first.status)

	bob := s.postAs("/payments", "order-42", `{"amount":5}`, "Cookie", "session=bob-secret; theme=dark")
	requireProblem(t, bob, http.StatusUnprocessableEntity, "key-reused")
	require.NotContains(t, bob.body, "execution")

	for _, cookies := range [][]string{
		{"Cookie", "theme=dark; session=alice-secret"},
		{"Cookie", "theme=dark", "Cookie", "session=alice-secret"}, // one line per cookie, as HTTP/2 sends them
	} {
		again := s.postAs("/payments", "order-42", `{"amount":5}`, cookies...)
		require.Equal(t, "true", again.header.Get(ReplayedHeader), "%q", cookies)
		require.Equal(t, first.body, again.body)
	}
	require.EqualValues(t, 1, s.execs.Load())
}

// A caller whose identity material changes between two tries of one
// request (it took a session from the token endpoint of the same
// Middleware, its bearer token was refreshed) is refused, and never pays
// twice. WithScope with a stable principal makes such a retry replay.
func TestKeyModeCallerWhoseMaterialChanges(t *testing.T) {
	t.Run("our session arrives", func(t *testing.T) {
		s := newShop(t)
		c := s.client()
		require.Equal(t, http.StatusCreated, s.post(c, "/payments", "pay-1", `{"amount":5}`).status)
		s.token(c) // the jar now holds the session cookie
		requireProblem(t, s.post(c, "/payments", "pay-1", `{"amount":5}`), http.StatusUnprocessableEntity, "key-reused")
		require.EqualValues(t, 1, s.execs.Load())
	})
	t.Run("bearer token refreshed", func(t *testing.T) {
		s := newShop(t)
		require.Equal(t, http.StatusCreated, s.postAs("/payments", "pay-1", `{}`, "Authorization", "Bearer old").status)
		requireProblem(t, s.postAs("/payments", "pay-1", `{}`, "Authorization", "Bearer new"),
			http.StatusUnprocessableEntity, "key-reused")
		require.EqualValues(t, 1, s.execs.Load())
	})
	t.Run("bearer token refreshed, scope names the client", func(t *testing.T) {
		s := newShop(t, WithScope(func(r *http.Request) (string, error) {
			return r.Header.Get("X-Client-Id"), nil // what the app's authentication found
		}))
		first := s.postAs("/payments", "pay-1", `{}`, "X-Client-Id", "c1", "Authorization", "Bearer old")
		require.Equal(t, http.StatusCreated, first.status)
		again := s.postAs("/payments", "pay-1", `{}`, "X-Client-Id", "c1", "Authorization", "Bearer new")
		require.Equal(t, "true", again.header.Get(ReplayedHeader))
		require.Equal(t, first.body, again.body)
		require.EqualValues(t, 1, s.execs.Load())
	})
}

// http.StripPrefix and routers rewrite r.URL.Path: two mounts of one
// protected handler are still two routes, since the middleware reads the
// path the client sent. So are two hosts that route to tenants. Port and
// case do not make another host.
func TestTwoMountsOfOneHandlerAreTwoRoutes(t *testing.T) {
	mounted := func(t *testing.T, opts ...Option) *shop {
		s := newShop(t, opts...)
		protected := s.idem.ProtectKey(http.HandlerFunc(s.count))
		mux := http.NewServeMux()
		mux.Handle("/tenants/a/", http.StripPrefix("/tenants/a", protected))
		mux.Handle("/tenants/b/", http.StripPrefix("/tenants/b", protected))
		mux.Handle("/", protected)
		s.srv = httptest.NewServer(mux)
		t.Cleanup(s.srv.Close)
		return s
	}
	t.Run("anonymous", func(t *testing.T) {
		s := mounted(t)
		a := s.postAs("/tenants/a/pay", "k", `{"amount":5}`)
		b := s.postAs("/tenants/b/pay", "k", `{"amount":5}`)
		require.Equal(t, http.StatusCreated, b.status)
		require.Empty(t, b.header.Get(ReplayedHeader), "tenant b never gets tenant a's answer")
		require.NotEqual(t, a.body, b.body)
		require.Equal(t, a.body, s.postAs("/tenants/a/pay", "k", `{"amount":5}`).body)

		onA := s.postAs("/pay", "h", `{}`, "Host", "a.shop.test")
		onB := s.postAs("/pay", "h", `{}`, "Host", "b.shop.test")
		require.Empty(t, onB.header.Get(ReplayedHeader), "host b never gets host a's answer")
		require.NotEqual(t, onA.body, onB.body)
		again := s.postAs("/pay", "h", `{}`, "Host", "A.Shop.Test:80")
		require.Equal(t, "true", again.header.Get(ReplayedHeader))
		require.Equal(t, onA.body, again.body)
		require.EqualValues(t, 4, s.execs.Load())
	})
	t.Run("scope function", func(t *testing.T) {
		s := mounted(t, WithScope(func(*http.Request) (string, error) { return "client-1", nil }))
		require.Equal(t, http.StatusCreated, s.postAs("/tenants/a/pay", "k", `{"amount":5}`).status)
		requireProblem(t, s.postAs("/tenants/b/pay", "k", `{"amount":5}`), http.StatusUnprocessableEntity, "key-reused")
		require.Equal(t, http.StatusCreated, s.postAs("/pay", "h", `{}`, "Host", "a.shop.test").status)
		requireProblem(t, s.postAs("/pay", "h", `{}`, "Host", "b.shop.test"), http.StatusUnprocessableEntity, "key-reused")
		require.EqualValues(t, 2, s.execs.Load())
	})
}

// Two spellings of one route are one route: percent-escapes of unreserved
// characters, and a fully qualified host name.
func TestSpellingsOfOneRouteAreOneRoute(t *testing.T) {
	require.Equal(t, hostName("shop.example"), hostName("SHOP.example.:443"))

	s := newShop(t)
	c := s.client()
	first := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/%70ayments", strings.NewReader(`{}`))
	req.Header.Set(KeyHeader, "k")
	req.Header.Set("Content-Type", "application/json")
	again := do(t, c, req)
	require.Equal(t, "true", again.header.Get(ReplayedHeader), again.body)
	require.EqualValues(t, 1, s.execs.Load())
}

// A session cannot read another session's replay, nor learn whether a
// token exists elsewhere: the answer is the unknown-token answer.
func TestScopesCannotReadEachOthersReplays(t *testing.T) {
	s := newShop(t)
	alice, mallory := s.client(), s.client()
	tok := s.token(alice)
	s.token(mallory)
	require.Equal(t, http.StatusCreated, s.post(alice, "/orders", tok, `{"card":"4242"}`).status)

	stolen := s.post(mallory, "/orders", tok, `{"card":"4242"}`)
	unknown := s.post(mallory, "/orders", "3f1e2d4c-5b6a-4789-8abc-def012345678", `{"card":"4242"}`)
	requireProblem(t, stolen, http.StatusUnprocessableEntity, "token-not-found")
	require.Equal(t, unknown.body, stolen.body, "a used token elsewhere looks like no token at all")
	require.NotContains(t, stolen.body, "execution")
	require.Equal(t, "true", s.post(alice, "/orders", tok, `{"card":"4242"}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
}

// Malformed keys never reach Redis, whatever their size or bytes.
func TestHostileKeysRejectedBeforeRedis(t *testing.T) {
	s := newShop(t)
	c := s.client()
	for _, key := range []string{
		strings.Repeat("k", 256), strings.Repeat("k", 64<<10), "a\x00b", "naïve", "tab\there", "\x7f",
	} {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, key)
		w := httptest.NewRecorder()
		s.idem.ProtectKey(http.NotFoundHandler()).ServeHTTP(w, req)
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", key)
	}
	// CR and LF cannot travel in a header; in a form they are refused too.
	requireProblem(t, s.postForm(c, "/orders", "idempotency_token=a%0D%0ASet-Cookie:%20x=1"), 400, "invalid-key")
	keys, err := s.rdb.Keys(t.Context(), "test-"+t.Name()+"*").Result()
	require.NoError(t, err)
	// Only the wiring wrote: Protect names its token key (tokensigners.go).
	keys = slices.DeleteFunc(keys, func(k string) bool { return strings.HasSuffix(k, ":token-signers") })
	require.Empty(t, keys, "nothing was written")
}
