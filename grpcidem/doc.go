// Package grpcidem makes unary gRPC methods safe to call twice, with the
// idempotency package's protocol on Redis.
//
// UnaryServerInterceptor runs a method at most once per idempotency key,
// read from the incoming metadata "idempotency-key": a retry with the same
// key and the same request gets the first call's response (or its final
// error status) back, marked with the response header
// "idempotent-replayed: true". UnaryClientInterceptor gives every call a
// key (a random UUID unless the caller set one) that all of the call's
// retries carry; it must run before, that is outside, any retrying
// interceptor.
//
// Streaming methods are not intercepted: a stream's messages cannot be
// replayed, so a streaming call runs every time.
package grpcidem
