package grpcidem_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency/grpcidem"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// callAs is the incoming context of a call with key, from who, as a
// scheme of identification names it.
type callAs func(key, who string) context.Context

func incoming(key string, md ...string) context.Context {
	return metadata.NewIncomingContext(context.Background(),
		metadata.Pairs(append([]string{grpcidem.DefaultMetadataKey, key, ":authority", "shop.test"}, md...)...))
}

var schemes = map[string]callAs{
	"authorization": func(key, who string) context.Context { return incoming(key, "authorization", "Bearer "+who) },
	"cookie":        func(key, who string) context.Context { return incoming(key, "cookie", "session="+who) },
	"api-key metadata": func(key, who string) context.Context {
		return incoming(key, "x-api-key", "sk_"+who)
	},
	"tls client certificate": func(key, who string) context.Context {
		state := tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Raw: []byte("certificate of " + who)}}}
		return peer.NewContext(incoming(key), &peer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
	},
	"proxy user metadata": func(key, who string) context.Context {
		return incoming(key, "x-forwarded-user", who+"@example.com")
	},
}

// The gRPC interceptor keeps the HTTP middleware's promise under each way
// of identifying callers (gRPC has no query string): Bob, sending Alice's
// key and request, runs his own call or is refused with a status, never
// gets Alice's answer; each caller's retry gets its own answer back.
func TestInterceptorNeverAnswersAnotherCaller(t *testing.T) {
	rules := map[string]map[string][]grpcidem.Option{
		"authorization": {
			"credentials": {grpcidem.WithCallerCredentials()},
			"identity":    {grpcidem.WithCallerIdentity(grpcidem.IdentityByMetadata("authorization"))},
		},
		"cookie": {"credentials": {grpcidem.WithCallerCredentials()}},
		"api-key metadata": {
			"credentials": {grpcidem.WithCallerCredentials("X-Api-Key")},
			"identity":    {grpcidem.WithCallerIdentity(grpcidem.IdentityByMetadata("x-api-key"))},
		},
		"tls client certificate": {
			"credentials": {grpcidem.WithCallerCredentials()},
			"identity":    {grpcidem.WithCallerIdentity(grpcidem.IdentityByPeerCertificate())},
		},
		"proxy user metadata": {
			"credentials": {grpcidem.WithCallerCredentials("x-forwarded-user")},
			"identity":    {grpcidem.WithCallerIdentity(grpcidem.IdentityByMetadata("x-forwarded-user"))},
		},
	}
	for scheme, as := range schemes {
		for rule, opts := range rules[scheme] {
			t.Run(scheme+"/"+rule, func(t *testing.T) {
				intercept := grpcidem.UnaryServerInterceptor(middleware(t), opts...)
				var runs atomic.Int64
				method := func(context.Context, any) (any, error) {
					return wrapperspb.String(fmt.Sprint("payment ", runs.Add(1))), nil
				}
				call := func(who string) (string, error) {
					resp, err := intercept(as("shared-key", who), wrapperspb.String("tea"),
						&grpc.UnaryServerInfo{FullMethod: chargeMethod}, method)
					if err != nil {
						return "", err
					}
					return resp.(*wrapperspb.StringValue).GetValue(), nil
				}
				alice, err := call("alice")
				require.NoError(t, err)
				require.Equal(t, "payment 1", alice)

				bob, err := call("bob")
				require.NotEqual(t, alice, bob, "bob must never receive alice's answer")
				if err == nil { // his own call ran
					require.Equal(t, "payment 2", bob)
					again, err := call("bob")
					require.NoError(t, err)
					require.Equal(t, bob, again)
				} else { // or it was refused, and said so
					require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
					require.EqualValues(t, 1, runs.Load())
				}
				again, err := call("alice")
				require.NoError(t, err)
				require.Equal(t, alice, again, "alice's retry gets her own answer")
			})
		}
	}
}

// The interceptor does not start without being told who the callers are.
func TestInterceptorNeedsACallerRule(t *testing.T) {
	m := middleware(t)
	require.PanicsWithValue(t, "grpcidem: UnaryServerInterceptor needs to know who the callers are, or one caller's "+
		"stored answer could reach another: pass WithCallerCredentials (authorization, proxy-authorization, "+
		"cookie, the peer's TLS certificate and the metadata you name), WithCallerIdentity "+
		"(IdentityByMetadata, IdentityByPeerCertificate or your own function) or WithSharedKeys",
		func() { grpcidem.UnaryServerInterceptor(m) })
	require.NotPanics(t, func() { grpcidem.UnaryServerInterceptor(m, grpcidem.WithSharedKeys()) })
}
