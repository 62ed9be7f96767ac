package idempotency

import (
	"log/slog"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
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
