package otelidem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/otelidem"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The observer counts and times every protected request and gives each a
// span. Without options it reports to otel.GetMeterProvider() and
// otel.GetTracerProvider(), the providers a program registers at start-up;
// here a manual reader and a span recorder stand in for their exporters,
// to show what they would receive.
func ExampleNewObserver() {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := otelidem.NewObserver(
		otelidem.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelidem.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
	)
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("otel-example"),
		idempotency.WithCallerCredentials(),
		idempotency.WithObserver(obs),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	pay := func(key string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":500}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	pay("order-12-payment")
	pay("order-12-payment") // a retry
	pay("")                 // a client that forgot the key

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var counts []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idempotency.requests" {
				for _, dp := range sum.DataPoints {
					outcome, _ := dp.Attributes.Value("idempotency.outcome")
					fromCache, _ := dp.Attributes.Value("idempotency.from_cache")
					counts = append(counts, fmt.Sprintf("%s %s from_cache=%v: %d",
						m.Name, outcome.AsString(), fromCache.AsBool(), dp.Value))
				}
			}
		}
	}
	slices.Sort(counts) // data points come in no particular order
	for _, c := range counts {
		fmt.Println(c)
	}
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "idempotency.outcome" {
				fmt.Println("span", s.Name(), a.Value.AsString())
			}
		}
	}
	// Output:
	// idempotency.requests executed from_cache=false: 1
	// idempotency.requests rejected from_cache=false: 1
	// idempotency.requests replayed from_cache=true: 1
	// span idempotency executed
	// span idempotency replayed
	// span idempotency rejected
}

// redisAddr is the Redis the example dials: the test suite's own server
// (REDIS_URL, else a private redis-server), shared with the tests, so the
// example keeps to the key prefix "otel-example", emptied once per run of
// what earlier runs left. Without a Redis for it, it names a port nothing
// listens on, so that the example fails on its output instead of running
// against whatever answers on go-redis's default address, localhost:6379.
var redisAddr = exampleRedisAddr()

func exampleRedisAddr() string {
	const unreachable = "127.0.0.1:0"
	opts, err := redistest.SharedOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples: no Redis to run against:", err)
		return unreachable
	}
	// The example spells out its client options and takes only the address
	// from here, so a server that needs more would be reached wrongly (a
	// database other than 0) or not at all.
	if opts.Username != "" || opts.Password != "" || opts.DB != 0 || opts.TLSConfig != nil {
		fmt.Fprintln(os.Stderr, "examples: REDIS_URL needs credentials, a database or TLS; the examples dial a bare address")
		return unreachable
	}
	rdb := redis.NewClient(&redis.Options{Addr: opts.Addr})
	defer rdb.Close()
	if err := redistest.DeleteKeys(rdb, "otel-example"); err != nil {
		fmt.Fprintln(os.Stderr, "examples: deleting what earlier runs left:", err)
	}
	return opts.Addr
}
