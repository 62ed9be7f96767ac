package e2e

import (
	"encoding/json"
	"fmt"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// buildShop compiles the example once for every scenario.
func buildShop(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "shop")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/onceonly/idempotency/example").CombinedOutput()
	require.NoError(t, err, "go build ./example:\n%s", out)
	return bin
}

// A shop is one running example process.
type shop struct {
	url string
	out *syncbuf.Buffer
}

// startShop runs the shop binary with the Redis at redisURL and extra
// environment (ORDER_LATENCY=…, IDEMPOTENCY_DISABLED=1), and stops it when
// t ends.
func startShop(t *testing.T, bin, redisURL string, environ ...string) *shop {
	addr := freeAddr(t)
	s := &shop{url: "http://" + addr, out: &syncbuf.Buffer{}}
	cmd := exec.Command(bin)
	// Later entries win, so the caller's environment cannot point the shop
	// at another Redis or switch its protection off by accident.
	cmd.Env = append(os.Environ(), "ADDR="+addr, "REDIS_URL="+redisURL, "REDIS_CLUSTER_ADDRS=",
		"IDEMPOTENCY_DISABLED=", "ORDER_LATENCY=0s", "PAYMENT_LATENCY=50ms")
	cmd.Env = append(cmd.Env, environ...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = childAttr()
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("shop output:\n%s", s.out)
		}
	})

	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(s.url + "/orders")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("the shop exited at start:\n%s", s.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shop did not answer within 10s:\n%s", s.out)
		}
	}
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
	resp, err := http.Get(s.url + path)
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

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// redisURL names database db of the server at addr: each scenario's shop
// gets a database of its own, so counts start at zero.
func redisURL(addr string, db int) string { return fmt.Sprintf("redis://%s/%d", addr, db) }
