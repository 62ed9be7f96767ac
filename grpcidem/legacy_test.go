package grpcidem_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/runtime/protoimpl"
)

// legacyCharge is a message as the older protobuf API generated it
// (github.com/golang/protobuf's protoc-gen-go before APIv2, gogo): struct
// tags and the v1 methods, no ProtoReflect.
type legacyCharge struct {
	Value string `protobuf:"bytes,1,opt,name=value,proto3" json:"value,omitempty"`
}

func (m *legacyCharge) Reset()         { *m = legacyCharge{} }
func (m *legacyCharge) String() string { return m.Value }
func (*legacyCharge) ProtoMessage()    {}

func init() {
	// What the older API's generated code does at init (proto.RegisterType).
	if err := protoregistry.GlobalTypes.RegisterMessage(protoimpl.X.LegacyMessageTypeOf(&legacyCharge{}, "grpcidem.test.LegacyCharge")); err != nil {
		panic(err)
	}
}

// A service whose messages use the older protobuf API is protected like
// any other: the call runs once, and the duplicate gets its response, as
// the method's own type.
//
// The duplicate is served from Redis too (no in-process cache): a retry
// that reaches another instance decodes the stored answer.
func TestMessagesOfTheOlderProtobufAPI(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []idempotency.Option
	}{
		{"replayed from memory", nil},
		{"replayed from Redis", []idempotency.Option{idempotency.WithResponseCache(0, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) { testOlderProtobufAPI(t, tc.opts...) })
	}
}

func testOlderProtobufAPI(t *testing.T, opts ...idempotency.Option) {
	intercept := grpcidem.UnaryServerInterceptor(middleware(t, opts...), grpcidem.WithCallerCredentials())
	var runs atomic.Int64
	handler := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		return &legacyCharge{Value: "charged " + req.(*legacyCharge).Value}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/grpcidem.test.Legacy/Charge"}
	call := func(value string) (any, error) {
		ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(grpcidem.DefaultMetadataKey, "order-1", ":authority", "pay.example"))
		return intercept(ctx, &legacyCharge{Value: value}, info, handler)
	}
	first, err := call("7")
	require.NoError(t, err)
	again, err := call("7")
	require.NoError(t, err)
	require.Equal(t, &legacyCharge{Value: "charged 7"}, first)
	require.Equal(t, first, again)
	require.EqualValues(t, 1, runs.Load())
	_, err = call("8")
	require.Error(t, err, "another request under the key is refused")
	require.EqualValues(t, 1, runs.Load())
}

// legacyReceipt is an older-API message that the newer API's registry
// does not know: gogo registers its types in a registry of its own, and a
// hand-written message in none.
type legacyReceipt struct {
	Value string `protobuf:"bytes,1,opt,name=value,proto3" json:"value,omitempty"`
}

func (m *legacyReceipt) Reset()         { *m = legacyReceipt{} }
func (m *legacyReceipt) String() string { return m.Value }
func (*legacyReceipt) ProtoMessage()    {}

// A response type that no registry names still replays from Redis, as the
// type the method returned: the interceptor knows it from the call that
// stored it.
func TestOlderAPIResponseOfNoRegistryReplays(t *testing.T) {
	intercept := grpcidem.UnaryServerInterceptor(middleware(t, idempotency.WithResponseCache(0, 0)), grpcidem.WithCallerCredentials())
	var runs atomic.Int64
	handler := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		return &legacyReceipt{Value: "charged " + req.(*legacyCharge).Value}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/grpcidem.test.Legacy/Receipt"}
	call := func() (any, error) {
		ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(grpcidem.DefaultMetadataKey, "order-2", ":authority", "pay.example"))
		return intercept(ctx, &legacyCharge{Value: "7"}, info, handler)
	}
	first, err := call()
	require.NoError(t, err)
	again, err := call()
	require.NoError(t, err, "the retry replays the stored response")
	require.Equal(t, &legacyReceipt{Value: "charged 7"}, first)
	require.Equal(t, first, again)
	require.EqualValues(t, 1, runs.Load())
}
