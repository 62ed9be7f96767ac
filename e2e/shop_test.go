package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/stretchr/testify/require"
)

// A shop is one running example process.
type shop struct{ *shopproc.Shop }

// startShop runs the shop binary with the Redis at redisURL and extra
// environment (ORDER_LATENCY=…, IDEMPOTENCY_DISABLED=1), and stops it when
// t ends.
func startShop(t *testing.T, bin, redisURL string, environ ...string) *shop {
	// Later entries win, so the caller's environment cannot point the shop
	// at another Redis or switch its protection off by accident.
	env := append([]string{"REDIS_URL=" + redisURL, "IDEMPOTENCY_DISABLED=", "ORDER_LATENCY=0s", "PAYMENT_LATENCY=50ms"},
		environ...)
	return &shop{shopproc.Start(t, bin, "/orders", 10*time.Second, env...)}
}

// count returns how many orders (path "/orders") or payments the shop holds.
func (s *shop) count(t *testing.T, path string) int {
	t.Helper()
	n, err := s.tryCount(path)
	require.NoError(t, err)
	return n
}

// settledCount waits up to 5 s for the count at path to reach want, for
// handlers that run on after their client left, and returns the last count.
func (s *shop) settledCount(t *testing.T, path string, want int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := s.count(t, path)
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *shop) tryCount(path string) (int, error) {
	resp, err := http.Get(s.URL + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	var items []json.RawMessage
	err = json.NewDecoder(resp.Body).Decode(&items)
	return len(items), err
}

// redisURL names database db of the server at addr: each scenario's shop
// gets a database of its own, so counts start at zero.
func redisURL(addr string, db int) string { return fmt.Sprintf("redis://%s/%d", addr, db) }
