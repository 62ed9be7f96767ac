package grpcidem

import (
	"context"

	"github.com/onceonly/idempotency"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// UnaryServerInterceptor runs each unary call that carries a key at most
// once per key, through idempotency.Do on m: its lock, lease, fencing
// token (idempotency.FencingToken works in the method), waiting
// duplicates, record TTL and observer. A key belongs to the method (and to
// the caller, with WithCallerIdentity) and to one request: the request
// message, marshalled deterministically, is fingerprinted, and the same
// key with another request is refused with FAILED_PRECONDITION.
//
// The first call gets what the method returned. Every other call with the
// key gets the stored answer and the header "idempotent-replayed: true":
// the same response message, or the same error status (code, message and
// details) when the error policy stored it (WithErrorPolicy). Header and
// trailer metadata the method set are not stored. The method's context
// keeps the call's metadata and peer but is not cancelled with the call:
// once started, the method finishes (within m's execution timeout) so that
// a retry finds its answer. Problems map to codes as Status says.
//
// A call without a key runs unprotected, or is refused with
// WithRequiredKey. Requests and responses must be proto messages.
func UnaryServerInterceptor(m *idempotency.Middleware, opts ...Option) grpc.UnaryServerInterceptor {
	cfg := newConfig(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !cfg.protects(info.FullMethod) {
			return handler(ctx, req)
		}
		id, err := cfg.incomingKey(ctx)
		if err != nil {
			return nil, Status(err).Err()
		}
		if id == "" {
			if cfg.required {
				return nil, Status(idempotency.ErrMissingKey).Err()
			}
			return handler(ctx, req)
		}
		key, err := cfg.keyFor(ctx, info.FullMethod, id, req)
		if err != nil {
			return nil, err
		}
		return cfg.serve(ctx, m, key, req, handler)
	}
}

// incomingKey reads the call's key: "" when it has none, an error when it
// has several or an empty one.
func (c *config) incomingKey(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	switch values := md.Get(c.metadataKey); {
	case len(values) == 0:
		return "", nil
	case len(values) > 1, values[0] == "":
		// Present but empty must not pass as a call without a key, and
		// two keys would leave the call's identity to chance.
		return "", idempotency.ErrInvalidKey
	default:
		return values[0], nil
	}
}

// keyFor scopes id by method and caller and binds it to the request.
func (c *config) keyFor(ctx context.Context, fullMethod, id string, req any) (idempotency.Key, error) {
	scope := fullMethod
	if c.identity != nil {
		caller, err := c.identity(ctx)
		if err != nil {
			if s, ok := status.FromError(err); ok {
				return idempotency.Key{}, s.Err()
			}
			return idempotency.Key{}, Status(idempotency.ErrNoScope).Err()
		}
		// A method name has no space, so the first space ends it and
		// no caller can make its scope look like another's.
		scope += " " + caller
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return idempotency.Key{}, status.Errorf(codes.Internal, "grpcidem: request %T is not a proto message", req)
	}
	input, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return idempotency.Key{}, status.Errorf(codes.Internal, "grpcidem: marshalling the request: %v", err)
	}
	return idempotency.Key{Scope: scope, ID: id, Input: input}, nil
}

// serve runs the method under key, or replays its stored answer.
func (c *config) serve(ctx context.Context, m *idempotency.Middleware, key idempotency.Key, req any, handler grpc.UnaryHandler) (any, error) {
	var (
		ran     bool
		resp    any
		respErr error
	)
	stored, err := idempotency.Do(ctx, m, key, func(ctx context.Context) (*spb.Status, error) {
		ran = true
		resp, respErr = handler(ctx, req)
		return answerOf(resp, respErr, c.storeError)
	}, idempotency.UseCodec(answerCodec{}))
	if ran {
		// The method's own result, unchanged, whether or not it was
		// stored: only duplicates get the stored copy.
		return resp, respErr
	}
	if err != nil {
		return nil, Status(err).Err()
	}
	// Best effort: it fails only when headers were already sent.
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
	return replay(stored)
}
