package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The test service, registered by hand so that no generated code is needed:
// a unary Charge with a side effect, and a server-streaming Watch.
const (
	chargeMethod = "/grpcidem.test.Payments/Charge"
	watchMethod  = "/grpcidem.test.Payments/Watch"
)

type paymentsServer interface {
	Charge(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
	Watch(*wrapperspb.StringValue, grpc.ServerStream) error
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "grpcidem.test.Payments",
	HandlerType: (*paymentsServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			charge := func(ctx context.Context, req any) (any, error) {
				return srv.(paymentsServer).Charge(ctx, req.(*wrapperspb.StringValue))
			}
			if interceptor == nil {
				return charge(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: chargeMethod}, charge)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			in := new(wrapperspb.StringValue)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			return srv.(paymentsServer).Watch(in, stream)
		},
	}},
}

// payments counts its executions. A request's value chooses what Charge
// does: "fail:N" returns code N, "slow…" takes 300ms, "release" calls
// idempotency.Release, "big" answers 4 KiB, "unsendable" a response that
// does not marshal, anything else succeeds.
type payments struct {
	runs   atomic.Int64
	mu     sync.Mutex
	perKey map[string]int
}

func newPayments() *payments { return &payments{perKey: map[string]int{}} }

func (p *payments) Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	n := p.runs.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	p.mu.Lock()
	p.perKey[strings.Join(md.Get(grpcidem.DefaultMetadataKey), ",")]++
	p.mu.Unlock()
	switch v := in.GetValue(); {
	case strings.HasPrefix(v, "fail:"):
		code, err := strconv.Atoi(strings.TrimPrefix(v, "fail:"))
		if err != nil {
			return nil, status.Errorf(codes.Internal, "bad test code %q", v)
		}
		return nil, status.Errorf(codes.Code(code), "charge %d refused", n)
	case strings.HasPrefix(v, "slow"):
		time.Sleep(300 * time.Millisecond)
	case v == "release":
		idempotency.Release(ctx)
	case v == "big":
		return wrapperspb.String(strings.Repeat("x", 4096)), nil
	case v == "unsendable": // a string field that is not UTF-8 does not marshal
		return wrapperspb.String(fmt.Sprintf("charge %d caf\xe9", n)), nil
	case v == "deadline": // a dependency's own timeout, wrapped
		return nil, fmt.Errorf("ledger %d: %w", n, context.DeadlineExceeded)
	}
	return wrapperspb.String(fmt.Sprintf("charge %d of %s", n, in.GetValue())), nil
}

func (p *payments) Watch(in *wrapperspb.StringValue, stream grpc.ServerStream) error {
	n := p.runs.Add(1)
	for i := range 3 {
		if err := stream.SendMsg(wrapperspb.String(fmt.Sprintf("watch %d update %d of %s", n, i, in.GetValue()))); err != nil {
			return err
		}
	}
	return nil
}

func (p *payments) runsFor(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.perKey[key]
}

// middleware is an idempotency middleware on the package's Redis with a
// prefix of the test's own; each call is a new instance, with its own
// client and memory, as another process would be.
func middleware(t *testing.T, opts ...idempotency.Option) *idempotency.Middleware {
	prefix := "grpcidem-" + strings.ReplaceAll(t.Name(), "/", "-")
	opts = append([]idempotency.Option{idempotency.WithKeyPrefix(prefix)}, opts...)
	return idempotency.New(redistest.Client(t, prefix), opts...)
}

// serve starts a gRPC server for svc on a loopback port and returns its
// address; it stops when the test ends.
func serve(t *testing.T, svc paymentsServer, interceptors ...grpc.UnaryServerInterceptor) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	srv.RegisterService(&paymentsDesc, svc)
	go srv.Serve(lis) // returns once Stop has run
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// dial connects to addr with the client interceptors and dial options given.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// reply is one Charge call's outcome.
type reply struct {
	value    string
	replayed bool
	err      error
}

func charge(ctx context.Context, conn *grpc.ClientConn, value string) reply {
	var header metadata.MD
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, chargeMethod, wrapperspb.String(value), out, grpc.Header(&header))
	return reply{value: out.GetValue(), replayed: strings.Join(header.Get(grpcidem.ReplayedHeader), ",") == "true", err: err}
}

// withKey is the test's context with key as the call's idempotency key.
func withKey(t *testing.T, key string) context.Context {
	return metadata.AppendToOutgoingContext(t.Context(), grpcidem.DefaultMetadataKey, key)
}

// keys lists the keys Charge ran with.
func (p *payments) keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keys []string
	for k := range p.perKey {
		keys = append(keys, k)
	}
	return keys
}

// problemOf reads what the interceptor put in a status: its ErrorInfo
// reason and its RetryInfo delay.
func problemOf(err error) (reason string, retryAfter time.Duration) {
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return reason, retryAfter
}
