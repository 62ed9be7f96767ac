package idempotency

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/require"
)

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
