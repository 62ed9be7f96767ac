// Package redistest gives tests a real Redis: REDIS_URL when set, else a
// private redis-server on a free loopback port, else (loudly) an embedded
// miniredis. IDEMPOTENCY_REQUIRE_REDIS=1 turns that last fallback into a
// failure, so the project's test command never passes on the embedded one by
// accident. Servers started here are stopped by Main.
package redistest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Main runs a test package's tests and then stops every server this package
// started, and runs after. Call it from TestMain.
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	stopAll()
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Client returns a client for the package's shared Redis, with every key
// under prefix deleted when the test ends. Tests that share it must use
// distinct prefixes; prefix then names everything the test writes.
func Client(t testing.TB, prefix string) redis.UniversalClient {
	t.Helper()
	if _, err := SharedOptions(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if shared.embedded != nil {
		t.Log("redistest: WARNING: no redis-server on PATH and no REDIS_URL; using the embedded miniredis")
	}
	rdb := redis.NewClient(shared.Options())
	t.Cleanup(func() {
		DeletePrefix(t, rdb, prefix)
		rdb.Close()
	})
	return rdb
}

// Private starts a redis-server that only this test uses, for tests that
// read server-wide figures (INFO commandstats) or stop the server. It skips
// the test when redis-server is missing, unless real Redis is required.
func Private(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		requireOrSkip(t, "redis-server is not on PATH")
	}
	s, err := StartServer(args...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func requireOrSkip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("IDEMPOTENCY_REQUIRE_REDIS") == "1" {
		t.Fatalf("redistest: %s, and IDEMPOTENCY_REQUIRE_REDIS=1", why)
	}
	t.Skipf("redistest: %s; skipping", why)
}

func startShared() (*Server, error) {
	if raw := os.Getenv("REDIS_URL"); raw != "" {
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		return &Server{opts: opts}, nil
	}
	if _, err := exec.LookPath("redis-server"); err == nil {
		return StartServer()
	}
	if os.Getenv("IDEMPOTENCY_REQUIRE_REDIS") == "1" {
		return nil, fmt.Errorf("redis-server is not on PATH, and IDEMPOTENCY_REQUIRE_REDIS=1")
	}
	fmt.Fprintln(os.Stderr, "redistest: WARNING: no redis-server on PATH and no REDIS_URL; falling back to the embedded miniredis")
	mr, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	s := &Server{opts: &redis.Options{Addr: mr.Addr()}, embedded: mr}
	track(s)
	return s, nil
}

// DeletePrefix deletes every key under prefix; it never flushes a database,
// since the server may not be ours.
func DeletePrefix(t testing.TB, rdb redis.UniversalClient, prefix string) {
	if err := DeleteKeys(rdb, prefix); err != nil {
		t.Logf("redistest: cleaning %q: %v", prefix, err)
	}
}

// DeleteKeys deletes every key under prefix, on every master of a cluster.
func DeleteKeys(rdb redis.UniversalClient, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, del)
	case *redis.Client:
		return del(ctx, c)
	}
	return fmt.Errorf("redistest: unsupported client %T", rdb)
}

// SharedOptions returns client options for the package's shared Redis, for
// code that has no testing.TB (Example functions).
func SharedOptions() (*redis.Options, error) {
	sharedOnce.Do(func() { shared, sharedErr = startShared() })
	if sharedErr != nil {
		return nil, sharedErr
	}
	return shared.Options(), nil
}

// URL renders a client's address as a redis:// URL.
func URL(opts *redis.Options) string {
	u := url.URL{Scheme: "redis", Host: opts.Addr}
	return u.String()
}

// Addrs joins addresses the way REDIS_CLUSTER_ADDRS expects them.
func Addrs(addrs []string) string { return strings.Join(addrs, ",") }
