package grpcidem

import (
	"context"
	"encoding/binary"
	"strings"

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
// duplicates, record TTL and observer. A key belongs to the method and the
// authority the call was sent to, and to one request: the request message,
// marshalled deterministically, is fingerprinted with the authority and,
// under WithCallerCredentials, the caller's credentials, and the same key
// with another request, or from another caller, is refused with
// FAILED_PRECONDITION. WithCallerIdentity names the caller instead: a key
// then belongs to the method and the caller. It panics unless one of
// WithCallerCredentials, WithCallerIdentity and WithSharedKeys says who
// the callers are.
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
	if cfg.identity == nil && cfg.caller == callerUnset {
		panic(errNoCallerRule)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !cfg.protects(info.FullMethod) {
			return handler(ctx, req)
		}
		// Refusals reach m's observer, as Do's and a request's do.
		id, err := cfg.incomingKey(ctx)
		if err != nil {
			return nil, Status(m.Refused(ctx, err)).Err()
		}
		if id == "" {
			if cfg.required {
				return nil, Status(m.Refused(ctx, idempotency.ErrMissingKey)).Err()
			}
			return handler(ctx, req)
		}
		scope, err := cfg.scopeOf(ctx, info.FullMethod)
		if err != nil {
			m.Refused(ctx, idempotency.ErrNoScope)
			return nil, err
		}
		key, err := cfg.keyFor(ctx, scope, id, req)
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

// scopeOf is the scope of a call's key: the method and the authority the
// client addressed, or with an identity function the method and the
// caller. An identity function's error is the call's answer (its own
// status, else NO_SCOPE).
func (c *config) scopeOf(ctx context.Context, fullMethod string) (string, error) {
	// A method name has neither '@' nor a space, so the first of them ends
	// it, and no caller or authority can make its scope look like another's.
	if c.identity == nil {
		md, _ := metadata.FromIncomingContext(ctx)
		return fullMethod + "@" + hostName(first(md.Get(":authority"))), nil
	}
	caller, err := c.identity(ctx)
	if err != nil {
		if s, ok := status.FromError(err); ok {
			return "", s.Err()
		}
		return "", Status(idempotency.ErrNoScope).Err()
	}
	return fullMethod + " " + caller, nil
}

// keyFor binds id, in scope, to the request. Without an identity
// function the rule is the HTTP middleware's: a key belongs to the method
// and the authority the client addressed, and under WithCallerCredentials
// the call to its caller, whose credentials are bound into the request's
// fingerprint, so that another caller, or the same one with a refreshed
// token, is refused as another request: it neither runs again nor gets
// the first caller's answer. An identity function names the caller
// instead, and its keys are the caller's.
func (c *config) keyFor(ctx context.Context, scope, id string, req any) (idempotency.Key, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	authority := hostName(first(md.Get(":authority")))
	msg, ok := messageOf(req)
	if !ok {
		return idempotency.Key{}, status.Errorf(codes.Internal, "grpcidem: request %T is not a proto message", req)
	}
	input, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return idempotency.Key{}, status.Errorf(codes.Internal, "grpcidem: marshalling the request: %v", err)
	}
	bindCaller := c.identity == nil && c.caller == callerCredentials
	return idempotency.Key{Scope: scope, ID: id, Input: c.appendBinding(ctx, input, md, authority, bindCaller)}, nil
}

// appendBinding binds a request's fingerprint to the authority and, with
// bindCaller, to the caller's credentials. It is appended to the request's
// bytes and read from the end: a flag, the credentials' digest when the
// flag says so, the authority's length and the authority.
func (c *config) appendBinding(ctx context.Context, input []byte, md metadata.MD, authority string, bindCaller bool) []byte {
	input = append(input, authority...)
	input = binary.BigEndian.AppendUint32(input, uint32(len(authority)))
	if bindCaller {
		if sum, ok := c.callerDigest(ctx, md); ok {
			return append(append(input, sum[:]...), 1)
		}
	}
	return append(input, 0)
}

// hostName is the authority without its port, in lower case: one host
// reached on two ports, or spelled in two cases, is one host.
func hostName(authority string) string {
	if i := strings.LastIndexByte(authority, ':'); i >= 0 && !strings.Contains(authority[i:], "]") {
		authority = authority[:i] // "[::1]:443" keeps its brackets; "[::1]" has no port
	}
	return strings.ToLower(authority)
}

func first(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
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
