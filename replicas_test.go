package idempotency

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestReplicaAcksFailClosedWithoutReplica(t *testing.T) {
	primary := redistest.Private(t)
	_, port, _ := strings.Cut(primary.Addr(), ":")
	replica := redistest.Private(t, "--replicaof", "127.0.0.1", port)
	rdb := primary.Client(t)
	require.Eventually(t, func() bool {
		info := rdb.Info(context.Background(), "replication").Val()
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, 10*time.Second, 20*time.Millisecond, "the replica syncs")

	s := newShopOn(t, rdb, WithReplicaAcks(1, 200*time.Millisecond))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", s.token(c), `{}`).status, "acknowledged by the replica")

	require.NoError(t, replica.Signal(syscall.SIGSTOP))
	tok := s.token(c)
	for i := range 3 {
		a := s.post(c, "/orders", tok, `{"try":`+strconv.Itoa(i)+`}`)
		requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
	}
	require.EqualValues(t, 1, s.execs.Load(), "no handler ran on an unreplicated claim")

	require.NoError(t, replica.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		return s.post(c, "/orders", tok, `{"try":9}`).status == http.StatusCreated
	}, 10*time.Second, 50*time.Millisecond, "the released token works once the replica is back")
	require.EqualValues(t, 2, s.execs.Load())
}
