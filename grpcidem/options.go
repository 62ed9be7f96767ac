package grpcidem

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMetadataKey is the metadata name that carries the idempotency key.
const DefaultMetadataKey = "idempotency-key"

// ReplayedHeader is the response header metadata set to "true" on an
// answer that was replayed instead of executed.
const ReplayedHeader = "idempotent-replayed"

// An Option configures UnaryServerInterceptor or UnaryClientInterceptor.
// WithMetadataKey and WithMethods apply to both; the others to the server.
type Option func(*config)

type config struct {
	metadataKey string
	methods     map[string]bool // nil: every unary method
	required    bool
	identity    func(context.Context) (string, error)
	caller      callerRule
	credentials []string // metadata names bound beside the standard ones
	storeError  func(*status.Status) bool
}

func newConfig(opts []Option) config {
	c := config{metadataKey: DefaultMetadataKey, storeError: StoreFinalErrors}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func (c *config) protects(fullMethod string) bool {
	return c.methods == nil || c.methods[fullMethod]
}

// WithMetadataKey names the metadata that carries the key, instead of
// "idempotency-key". gRPC metadata names are lower case; name is lowered.
func WithMetadataKey(name string) Option {
	return func(c *config) { c.metadataKey = strings.ToLower(name) }
}

// WithMethods limits the interceptor to the named methods, by full name
// ("/shop.v1.Payments/Charge"); every other method passes through
// untouched. By default every unary method is covered, which with
// WithRequiredKey includes health checks and reflection.
func WithMethods(fullMethods ...string) Option {
	return func(c *config) {
		c.methods = make(map[string]bool, len(fullMethods))
		for _, m := range fullMethods {
			c.methods[m] = true
		}
	}
}

// WithRequiredKey refuses a call without a key (INVALID_ARGUMENT) instead
// of running it unprotected.
func WithRequiredKey() Option { return func(c *config) { c.required = true } }

// WithCallerIdentity scopes keys by caller: identity names whoever makes the
// call (a user, a tenant, a client certificate's subject), so that two
// callers' keys never meet, and a caller's retry replays whatever token it
// carries now. Take it from something the server authenticated, not from
// metadata the caller may set at will. IdentityByMetadata and
// IdentityByPeerCertificate are ready-made. An error refuses the call: a
// status error as it is, any other as UNAUTHENTICATED. It takes precedence
// over WithCallerCredentials and WithSharedKeys.
//
// UnaryServerInterceptor panics unless one of the three says who the
// callers are: otherwise a caller that sends another's key and request
// could receive its answer.
func WithCallerIdentity(identity func(ctx context.Context) (string, error)) Option {
	return func(c *config) { c.identity = identity }
}

// WithCallerCredentials tells the interceptor that callers are told apart
// by their credentials, and binds them into every call's fingerprint: the
// authorization, proxy-authorization and cookie metadata, the client
// certificate of the call's TLS peer, and the metadata named here (an API
// key, the user an authenticating proxy names). A key belongs to the
// method and the authority (without port, in lower case). The same key
// from another caller, or from one whose token was refreshed between two
// tries, is refused (FAILED_PRECONDITION, KEY_REUSED) instead of getting
// the first caller's answer or running again. Calls with none of them
// share the method's keys. Name every metadata your callers may
// authenticate by: one left out lets a caller receive another's answer.
// Binary metadata (a name ending in -bin, such as authorization-bin) is
// none of the defaults: name it too.
func WithCallerCredentials(metadataNames ...string) Option {
	return func(c *config) {
		c.caller = callerCredentials
		c.credentials = c.credentials[:0]
		for _, n := range metadataNames {
			c.credentials = append(c.credentials, strings.ToLower(n))
		}
	}
}

// WithSharedKeys tells the interceptor that every caller shares a method's
// keys: whoever presents a key receives the answer stored for it, and
// nothing about the caller is checked. Only for one caller, or callers
// that trust each other, never for a public API.
func WithSharedKeys() Option { return func(c *config) { c.caller, c.credentials = callerShared, nil } }

// WithErrorPolicy decides what happens to an error status the method
// returns: store reports true to store it and answer every retry with it,
// false to give the key up so that a retry runs the method again. The
// default is StoreFinalErrors. An OK response is always stored, unless the
// method called idempotency.Release.
func WithErrorPolicy(store func(*status.Status) bool) Option {
	return func(c *config) { c.storeError = store }
}

// StoreFinalErrors, the default error policy, stores every error except
// those whose code says that nothing happened and a retry may succeed:
// CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED and
// UNAVAILABLE. Other codes, INVALID_ARGUMENT, FAILED_PRECONDITION,
// INTERNAL and UNKNOWN (a plain Go error) among them, are final answers or
// may follow a side effect, so a retry gets them back instead of a second
// run. A method that failed before doing anything can return one of the
// released codes, or call idempotency.Release, to let a retry run it.
func StoreFinalErrors(s *status.Status) bool {
	switch s.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Unavailable:
		return false
	}
	return true
}

// StoreNoErrors is the error policy that stores OK responses only: every
// error gives the key up, as idempotency.Do does by default. Choose it
// when the methods fail only before their side effects.
func StoreNoErrors(*status.Status) bool { return false }
