package client

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// An attempt is what a scripted server received once.
type attempt struct {
	keys   []string // every Idempotency-Key value it carried
	body   string
	at     time.Time
	method string
}

// A scriptedServer answers its n-th request with script[n], and every later
// one with the script's last answer. It records each request for the test
// goroutine to check; handlers never assert.
type scriptedServer struct {
	*httptest.Server
	mu       sync.Mutex
	attempts []attempt
	conns    int // connections accepted
}

func newScriptedServer(t *testing.T, script ...http.HandlerFunc) *scriptedServer {
	s := &scriptedServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.attempts)
		s.attempts = append(s.attempts, attempt{keys: r.Header.Values(KeyHeader), body: string(body), at: time.Now(),
			method: r.Method})
		s.mu.Unlock()
		script[min(n, len(script)-1)](w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *scriptedServer) seen() []attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]attempt(nil), s.attempts...)
}

func (s *scriptedServer) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// answerWith answers code with the header name, value, … pairs and a body.
func answerWith(code int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// problemOf answers as the middleware answers err.
func problemOf(err error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { idempotency.DefaultErrorHandler(w, r, err) }
}

// hangUp closes the connection without an answer, as a network that lost
// the answer does.
func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

var (
	answerCreated     = answerWith(http.StatusCreated, `{"id":1}`)
	answerUnavailable = answerWith(http.StatusServiceUnavailable, "try later", "Retry-After", "0")
)

// start starts srv, over HTTP/2 with TLS when http2 is set, with its
// error log silenced (the tests cut connections on purpose); it closes when
// the test ends.
func start(t *testing.T, srv *httptest.Server, http2 bool) {
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if http2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
}

// fastTransport is a Transport whose back-off is short enough for tests,
// on a connection pool of its own.
func fastTransport(t *testing.T) *Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	return &Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}
}

// postTo sends a POST through rt and returns the answer read in full.
func postTo(t *testing.T, rt http.RoundTripper, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := (&http.Client{Transport: rt}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(body)
}

func newPost(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// keysOf lists the key of each attempt, failing when one carried none or
// several.
func keysOf(t *testing.T, attempts []attempt) []string {
	t.Helper()
	var keys []string
	for i, a := range attempts {
		require.Len(t, a.keys, 1, "attempt %d carries one key", i+1)
		keys = append(keys, a.keys[0])
	}
	return keys
}

// generatedKey requires that each of the want attempts carried one key,
// the first attempt's, and that it is a UUID; it returns the UUID.
func generatedKey(t *testing.T, attempts []attempt, want int) uuid.UUID {
	t.Helper()
	keys := keysOf(t, attempts)
	require.Len(t, keys, want)
	for _, k := range keys {
		require.Equal(t, keys[0], k, "every attempt carries the first attempt's key")
	}
	id, err := uuid.Parse(keys[0])
	require.NoError(t, err)
	return id
}

func TestMain(m *testing.M) { redistest.Main(m) }
