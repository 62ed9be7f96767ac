package idempotency

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// clientTo is a client of the Redis at addr (a proxy, say), with context
// deadlines honoured as the documentation asks, closed when t ends.
func clientTo(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// shop is a protected test server: POST /orders in token mode and
// POST /payments in key mode run handler, counting executions.
type shop struct {
	t       *testing.T
	rdb     redis.UniversalClient
	idem    *Middleware
	srv     *httptest.Server
	execs   atomic.Int64
	handler http.HandlerFunc
}

// defaultHandler answers like an order endpoint: 201, a JSON body with the
// execution number, a Location and a cookie that must not be replayed. The
// cookie is for the order's page only: sent back to the protected routes,
// it would change the caller's identity material between two tries, and
// key mode would refuse the second (TestKeyModeCallerWhoseMaterialChanges).
func (s *shop) defaultHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.Header().Set("X-Request-Body", string(body))
	http.SetCookie(w, &http.Cookie{Name: "flash", Value: "created", Path: "/orders/1"})
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"execution":`+itoa(s.execs.Load())+`}`)
}

// count is the shop's protected handler: it counts the execution and runs
// whatever s.handler is now.
func (s *shop) count(w http.ResponseWriter, r *http.Request) {
	s.execs.Add(1)
	s.handler(w, r)
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// testKeys is the key ring of the tests' shops.
var testKeys = WithTokenKeys(TokenKeys{Sign: []byte("the tests' token key, 32 bytes or more")})

func newShop(t *testing.T, opts ...Option) *shop {
	t.Helper()
	prefix := "test-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	rdb := redistest.Client(t, prefix)
	return newShopOn(t, rdb, append([]Option{WithKeyPrefix(prefix)}, opts...)...)
}

// newShopOn's key mode binds the callers' credentials, and its tokens are
// signed with testKeys, unless opts say otherwise: every shop of a test is
// an instance of one deployment.
func newShopOn(t *testing.T, rdb redis.UniversalClient, opts ...Option) *shop {
	t.Helper()
	s := &shop{t: t, rdb: rdb, idem: New(rdb, append([]Option{WithCallerCredentials(), testKeys}, opts...)...)}
	s.handler = s.defaultHandler
	mux := http.NewServeMux()
	mux.Handle("/idempotency/token", s.idem.TokenHandler())
	mux.Handle("POST /orders", s.idem.Protect(http.HandlerFunc(s.count)))
	mux.Handle("POST /payments", s.idem.ProtectKey(http.HandlerFunc(s.count)))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

// client is a browser-like caller with its own cookie jar (its session).
func (s *shop) client() *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(s.t, err)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// token fetches a token for c's session from the token endpoint.
func (s *shop) token(c *http.Client) string {
	s.t.Helper()
	resp, err := c.Get(s.srv.URL + "/idempotency/token")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	var body struct {
		Token     string `json:"token"`
		ExpiresIn int    `json:"expires_in"`
	}
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&body))
	require.NotEmpty(s.t, body.Token)
	return body.Token
}

// answer is a response read in full.
type answer struct {
	status int
	header http.Header
	body   string
}

func (s *shop) post(c *http.Client, path, key, body string) answer {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	return do(s.t, c, req)
}

// postDropped posts once to a handler that panics, so that the server
// drops the connection: on a transport of its own, since net/http resends
// a request that failed on a pooled connection. What came back, if
// anything, is not read.
func (s *shop) postDropped(path, key, body string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set(KeyHeader, key)
	if resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req); err == nil {
		resp.Body.Close()
	}
}

func do(t testing.TB, c *http.Client, req *http.Request) answer {
	t.Helper()
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// requireProblem checks a problem+json answer of the given type.
func requireProblem(t testing.TB, a answer, status int, slug string) {
	t.Helper()
	require.Equal(t, status, a.status, a.body)
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &p), a.body)
	require.Equal(t, ProblemTypeBase+slug, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
}

// keysWithoutTTL lists the keys under prefix that would live forever.
func keysWithoutTTL(t testing.TB, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	var forever []string
	ctx := t.Context()
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl < 0 {
			forever = append(forever, k)
		}
	}
	return forever
}

// postAsync posts from another goroutine, which must not fail the test
// itself: the answer (or the error) arrives on the channel, for the test's
// own goroutine to check with (answer).must.
func (s *shop) postAsync(c *http.Client, path, key, body string) <-chan asyncAnswer {
	done := make(chan asyncAnswer, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
		if err != nil {
			done <- asyncAnswer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(KeyHeader, key)
		a, err := tryDo(c, req)
		done <- asyncAnswer{a, err}
	}()
	return done
}

type asyncAnswer struct {
	answer
	err error
}

func (a asyncAnswer) must(t testing.TB) answer {
	t.Helper()
	require.NoError(t, a.err)
	return a.answer
}

// tryDo is do for goroutines that are not the test's.
func tryDo(c *http.Client, req *http.Request) (answer, error) {
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}, err
}

// paymentID is the identity of key on the shop's key-mode route, which
// the test server on loopback is addressed by.
func paymentID(key string) identity { return routeIdentity("127.0.0.1", "/payments", key) }
