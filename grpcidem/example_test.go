package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A server that runs each Charge once per key, and a client whose retries
// keep the call's key. The second call with the key gets the first one's
// response back, marked replayed.
func Example() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("grpc-example"))

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(idem, grpcidem.WithCallerCredentials())))
	srv.RegisterService(&paymentsDesc, newPayments()) // pb.RegisterPaymentsServer(srv, …) in your program
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			grpcidem.UnaryClientInterceptor(), // first, so that every retry below carries its key
			retry.UnaryClientInterceptor(retry.WithMax(3)),
		),
	)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	// The caller's own key; without one the client interceptor makes one
	// per call.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-12-payment")
	for range 2 {
		var header metadata.MD
		out := new(wrapperspb.StringValue)
		// client.Charge(ctx, req, grpc.Header(&header)) with generated code
		err := conn.Invoke(ctx, chargeMethod, wrapperspb.String("tea"), out, grpc.Header(&header))
		fmt.Printf("%s, replayed %v, error %v\n", out.GetValue(), header.Get(grpcidem.ReplayedHeader), err)
	}
	// Output:
	// charge 1 of tea, replayed [], error <nil>
	// charge 1 of tea, replayed [true], error <nil>
}

// redisAddr is the Redis the example dials: the test suite's own server
// (REDIS_URL, else a private redis-server), shared with the tests, so the
// example keeps to the key prefix "grpc-example", emptied once per run of
// what earlier runs left. Without a Redis for it, it names a port nothing
// listens on, so that the example fails on its output instead of running
// against whatever answers on go-redis's default address, localhost:6379.
var redisAddr = exampleRedisAddr()

func exampleRedisAddr() string {
	const unreachable = "127.0.0.1:0"
	opts, err := redistest.SharedOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "example: no Redis to run against:", err)
		return unreachable
	}
	// The example spells out its client options and takes only the address
	// from here, so a server that needs more would be reached wrongly.
	if opts.Username != "" || opts.Password != "" || opts.DB != 0 || opts.TLSConfig != nil {
		fmt.Fprintln(os.Stderr, "example: REDIS_URL needs credentials, a database or TLS; the example dials a bare address")
		return unreachable
	}
	rdb := redis.NewClient(&redis.Options{Addr: opts.Addr})
	defer rdb.Close()
	if err := redistest.DeleteKeys(rdb, "grpc-example"); err != nil {
		fmt.Fprintln(os.Stderr, "example: deleting what earlier runs left:", err)
	}
	return opts.Addr
}
