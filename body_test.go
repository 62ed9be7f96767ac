package idempotency

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// formParser parses the form before the protection, as CSRF and method
// override middleware do. For methods other than POST, PUT and PATCH
// net/http reads no body then, and leaves r.PostForm an empty map.
func formParser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		if m := r.PostForm.Get("_method"); r.Method == http.MethodPost && m != "" {
			r.Method = m // method override: the form was read as a POST's
		}
		next.ServeHTTP(w, r)
	})
}

// Whatever middleware outside parsed, the body of every method is
// fingerprinted and held to the limit.
func TestBodyOfEveryMethodBehindAFormParser(t *testing.T) {
	s := newShop(t, WithMaxRequestBytes(64))
	srv := httptest.NewServer(formParser(s.idem.ProtectKey(http.HandlerFunc(s.count))))
	defer srv.Close()
	send := func(method, key, body string) answer {
		req, err := http.NewRequest(method, srv.URL+"/items", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(KeyHeader, key)
		return do(t, srv.Client(), req)
	}
	tests := []struct {
		name, method, prefix string
		handlerSeesBody      bool
	}{
		{"DELETE", http.MethodDelete, "", true},
		{"custom method", "PURGE", "", true},
		{"POST", http.MethodPost, "", false},
		{"PATCH", http.MethodPatch, "", false},
		{"POST overridden to DELETE", http.MethodPost, "_method=DELETE&", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			first := send(tc.method, key, tc.prefix+"id=1")
			require.Equal(t, http.StatusCreated, first.status, first.body)
			if tc.handlerSeesBody {
				require.Equal(t, "id=1", first.header.Get("X-Request-Body"))
			}
			require.Equal(t, "true", send(tc.method, key, tc.prefix+"id=1").header.Get(ReplayedHeader))
			requireProblem(t, send(tc.method, key, tc.prefix+"id=2"), 422, "key-reused")
			requireProblem(t, send(tc.method, key+"-large", tc.prefix+"id="+strings.Repeat("9", 64)),
				413, "request-too-large")
		})
	}
	require.EqualValues(t, len(tests), s.execs.Load())
}

// A request costs memory for the bytes it sent, not for the length it
// declared: connections that promise a large body and send a few bytes pin
// little while the server waits for the rest.
func TestBodyMemoryGrowsWithBytesReceived(t *testing.T) {
	const conns, declared = 64, 1 << 20
	s := newShop(t, WithMaxRequestBytes(declared))
	var waiting atomic.Int64
	protected := s.idem.ProtectKey(http.HandlerFunc(s.count))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waiting.Add(1)
		protected.ServeHTTP(w, r)
	}))
	defer srv.Close()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	deadline := time.Now().Add(20 * time.Second)
	for i := range conns {
		c, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 5*time.Second)
		require.NoError(t, err)
		defer c.Close()
		c.SetDeadline(deadline)
		_, err = fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Length: %d\r\n\r\n{\"a\":", i, declared)
		require.NoError(t, err)
	}
	for waiting.Load() < conns {
		require.True(t, time.Now().Before(deadline), "%d of %d requests reached the middleware", waiting.Load(), conns)
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // for each to block reading its body

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use grew by %.2f MiB for %d connections", float64(growth)/(1<<20), conns)
	require.Less(t, growth, int64(8<<20))
	require.Zero(t, s.execs.Load(), "no request had its body yet")
}
