package idempotency

import (
	"log/slog"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// New warns when Redis may evict the middleware's keys.
func TestNewWarnsOfAnEvictingRedis(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "allkeys-lru")
	var logs syncbuf.Buffer
	New(srv.Client(t), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Contains(t, logs.String(), "maxmemory-policy=allkeys-lru")

	var quiet syncbuf.Buffer
	safe := redistest.Private(t, "--maxmemory-policy", "noeviction")
	New(safe.Client(t), WithLogger(slog.New(slog.NewTextHandler(&quiet, nil))))
	require.NotContains(t, quiet.String(), "maxmemory-policy")
}

// Where CONFIG is refused (renamed away, as managed services do, or denied
// to an ACL user without @admin), the policy is read from INFO memory, and
// an evicting one is still warned of.
func TestNewWarnsOfAnEvictingRedisWithoutConfig(t *testing.T) {
	renamed := redistest.Private(t, "--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", "")
	require.ErrorContains(t, renamed.Client(t).ConfigGet(t.Context(), "maxmemory-policy").Err(), "unknown command")

	denied := redistest.Private(t, "--maxmemory-policy", "allkeys-lfu")
	require.NoError(t, denied.Client(t).Do(t.Context(),
		"ACL", "SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all", "-@admin").Err())
	opts := denied.Options()
	opts.Username, opts.Password = "app", "app-secret"
	app := redis.NewClient(opts)
	t.Cleanup(func() { app.Close() })
	require.ErrorContains(t, app.ConfigGet(t.Context(), "maxmemory-policy").Err(), "NOPERM")

	for policy, rdb := range map[string]redis.UniversalClient{"volatile-lru": renamed.Client(t), "allkeys-lfu": app} {
		var logs syncbuf.Buffer
		New(rdb, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "maxmemory-policy="+policy)
	}

	var quiet syncbuf.Buffer
	safe := redistest.Private(t, "--maxmemory-policy", "noeviction", "--rename-command", "CONFIG", "")
	New(safe.Client(t), WithLogger(slog.New(slog.NewTextHandler(&quiet, nil))))
	require.Empty(t, quiet.String(), "noeviction, read from INFO memory")
}
