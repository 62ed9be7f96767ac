package grpcidem

import (
	"context"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// UnaryClientInterceptor gives each unary call an idempotency key in its
// outgoing metadata: the caller's own when the context already carries
// one (metadata.AppendToOutgoingContext(ctx, "idempotency-key", orderID)),
// which is never replaced, else a random UUID (version 4).
//
// The key is attached once per call, so every retry of the call must see
// it: put this interceptor before any retrying interceptor in
// grpc.WithChainUnaryInterceptor (the first one listed is the outermost),
// or retry with gRPC's own retry policy (service config), which resends
// the same metadata. Listed after a retrying interceptor, it would give
// each attempt a new key, and each attempt would run the method again. A
// caller that retries by calling again (a new call, not a retry of one)
// must set its own key for the same reason.
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	cfg := newConfig(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if cfg.protects(method) {
			ctx = cfg.withKey(ctx)
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

func (c *config) withKey(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(c.metadataKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, c.metadataKey, uuid.NewString())
}
