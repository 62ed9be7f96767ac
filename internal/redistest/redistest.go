// Package redistest gives tests a real Redis: REDIS_URL when set, else a
// private redis-server on a free loopback port. Without either, tests that
// need Redis skip and say why; IDEMPOTENCY_REQUIRE_REDIS=1 turns that skip
// into a failure, so the project's test command never passes without Redis
// by accident. There is no embedded fallback: an embedded Redis would bring
// its module into the root module's graph, which is every user's, and it
// lacks WAIT, CONFIG and cluster mode the tests rely on. Servers started
// here are stopped by Main.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

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
		if errors.Is(err, errNoRedis) {
			requireOrSkip(t, errNoRedis.Error())
		}
		t.Fatalf("redistest: %v", err)
	}
	rdb := redis.NewClient(shared.Options())
	t.Cleanup(func() {
		DeletePrefix(t, rdb, prefix)
		rdb.Close()
	})
	return rdb
}

// Private starts a Redis server (ServerCommand) that only this test uses, for tests that
// read server-wide figures (INFO commandstats) or stop the server. It skips
// the test when redis-server is missing, unless real Redis is required.
func Private(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath(ServerCommand()); err != nil {
		requireOrSkip(t, ServerCommand()+" is not on PATH")
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
	if _, err := exec.LookPath(ServerCommand()); err == nil {
		return StartServer()
	}
	return nil, errNoRedis
}

var errNoRedis = fmt.Errorf("no REDIS_URL and no %s on PATH (./scripts/test.sh installs it)", ServerCommand())

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

// unreachableAddr is what ExampleAddr gives when there is no Redis for the
// examples: they then fail on their output, as they must, instead of
// running against whatever answers on go-redis's default address,
// localhost:6379.
const unreachableAddr = "127.0.0.1:0"

// ExampleAddr is the Redis that a package's Example functions dial: the
// test suite's own server (REDIS_URL, else a private redis-server). The
// examples share it with the tests and with other packages' examples, so
// each package keeps its examples under a key prefix of its own, and what
// earlier runs left under prefix is deleted here, once per run.
func ExampleAddr(prefix string) string {
	opts, err := SharedOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples: no Redis to run against:", err)
		return unreachableAddr
	}
	// The examples spell out their client options and take only the address
	// from here, so a server that needs more would be reached wrongly (a
	// database other than 0) or not at all.
	if opts.Username != "" || opts.Password != "" || opts.DB != 0 || opts.TLSConfig != nil {
		fmt.Fprintln(os.Stderr, "examples: REDIS_URL needs credentials, a database or TLS; the examples dial a bare address")
		return unreachableAddr
	}
	rdb := redis.NewClient(&redis.Options{Addr: opts.Addr})
	defer rdb.Close()
	if err := DeleteKeys(rdb, prefix); err != nil {
		fmt.Fprintln(os.Stderr, "examples: deleting what earlier runs left:", err)
	}
	return opts.Addr
}
