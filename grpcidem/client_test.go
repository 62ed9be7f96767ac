package grpcidem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// loseReplies stands for a network that loses the server's first n
// answers: the call runs (the method, the interceptors inside this one),
// and the client hears UNAVAILABLE instead of the answer.
func loseReplies(n int64) grpc.UnaryServerInterceptor {
	var lost atomic.Int64
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if lost.Add(1) <= n {
			return nil, status.Error(codes.Unavailable, "reply lost")
		}
		return resp, err
	}
}

func retrying() grpc.UnaryClientInterceptor {
	return retry.UnaryClientInterceptor(
		retry.WithMax(5),
		retry.WithCodes(codes.Unavailable, codes.Aborted),
		retry.WithBackoff(retry.BackoffLinear(10*time.Millisecond)),
	)
}

// The key interceptor before the retrying one: two answers are lost, the
// third attempt carries the same key and gets the first execution's
// response, replayed; another instance on the same Redis replays it too.
func TestRetriesThroughLostRepliesGetTheFirstResponse(t *testing.T) {
	svc := newPayments()
	a := serve(t, svc, loseReplies(2), grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))
	b := serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))
	conn := dial(t, a, grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(), retrying()))

	r := charge(t.Context(), conn, "tea")
	require.NoError(t, r.err)
	require.Equal(t, "charge 1 of tea", r.value)
	require.True(t, r.replayed)
	require.EqualValues(t, 1, svc.runs.Load())

	keys := svc.keys()
	require.Len(t, keys, 1, "every attempt carried one key")
	other := charge(withKey(t, keys[0]), dial(t, b), "tea")
	require.NoError(t, other.err)
	require.Equal(t, "charge 1 of tea", other.value)
	require.True(t, other.replayed)
	require.EqualValues(t, 1, svc.runs.Load())
}

// The wrong order, to show why the rule exists: a retrying interceptor
// outside the key interceptor gives every attempt a key of its own, and
// every attempt runs the method.
func TestKeyInterceptorInsideRetriesRunsEveryAttempt(t *testing.T) {
	svc := newPayments()
	addr := serve(t, svc, loseReplies(2), grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))
	conn := dial(t, addr, grpc.WithChainUnaryInterceptor(retrying(), grpcidem.UnaryClientInterceptor()))

	r := charge(t.Context(), conn, "tea")
	require.NoError(t, r.err)
	require.Equal(t, "charge 3 of tea", r.value)
	require.EqualValues(t, 3, svc.runs.Load())
	require.Len(t, svc.keys(), 3)
}

// gRPC's own retry policy resends a call's metadata, key included. It
// retries only calls that got no response header, and the replay sets one:
// so one lost reply here, not two.
func TestBuiltInRetryPolicyKeepsTheKey(t *testing.T) {
	svc := newPayments()
	addr := serve(t, svc, loseReplies(1), grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))
	conn := dial(t, addr,
		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "grpcidem.test.Payments"}],
			"retryPolicy": {
				"maxAttempts": 4,
				"initialBackoff": "0.01s",
				"maxBackoff": "0.05s",
				"backoffMultiplier": 2,
				"retryableStatusCodes": ["UNAVAILABLE"]
			}
		}]}`),
	)

	r := charge(t.Context(), conn, "tea")
	require.NoError(t, r.err)
	require.Equal(t, "charge 1 of tea", r.value)
	require.True(t, r.replayed)
	require.EqualValues(t, 1, svc.runs.Load())
	require.Len(t, svc.keys(), 1)
}

func TestClientKeepsTheCallersKey(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc), grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
	require.NoError(t, charge(withKey(t, "order-1"), conn, "tea").err)
	require.Equal(t, []string{"order-1"}, svc.keys())
}

func TestClientGeneratesARandomKeyPerCall(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc), grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
	require.NoError(t, charge(t.Context(), conn, "tea").err)
	require.NoError(t, charge(t.Context(), conn, "tea").err)
	keys := svc.keys()
	require.Len(t, keys, 2, "two calls, two keys")
	for _, k := range keys {
		id, err := uuid.Parse(k)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(4), id.Version())
	}
}

// A key under another metadata name, on both sides.
func TestMetadataKeyName(t *testing.T) {
	svc := newPayments()
	addr := serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials(), grpcidem.WithMetadataKey("X-Request-Id")))
	conn := dial(t, addr, grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(grpcidem.WithMetadataKey("X-Request-Id"))))

	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "order-1")
	first := charge(ctx, conn, "tea")
	second := charge(ctx, conn, "tea")
	require.NoError(t, second.err)
	require.Equal(t, first.value, second.value)
	require.True(t, second.replayed)
	require.EqualValues(t, 1, svc.runs.Load())
}
