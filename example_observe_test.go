package idempotency_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// An observer sees every request on a protected route once it has been
// answered: what the middleware did with it, and why when it refused it.
// This one prints; a real one counts (see LogObserver, and the otelidem
// package for OpenTelemetry).
func ExampleWithObserver() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:observer"),
		idempotency.WithCallerCredentials(),
		idempotency.WithObserver(func(e idempotency.Event) {
			what := "a function call (Do)"
			if e.Request != nil {
				what = e.Request.Method + " " + e.Request.URL.Path
			}
			fmt.Printf("%s: %s", what, e.Outcome)
			if e.FromCache {
				fmt.Print(", from this process's memory")
			}
			if e.Err != nil {
				fmt.Print(": ", e.Err)
			}
			fmt.Println()
		}),
	)
	mux := http.NewServeMux()
	mux.Handle("/payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))

	send := func(method, key string) {
		req := httptest.NewRequest(method, "/payments", strings.NewReader(`{"amount":500}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	send(http.MethodPost, "order-9-payment")
	send(http.MethodPost, "order-9-payment") // a retry
	send(http.MethodPost, "")                // a client that forgot the key
	send(http.MethodGet, "")                 // safe methods pass through
	// Output:
	// POST /payments: executed
	// POST /payments: replayed, from this process's memory
	// POST /payments: rejected: idempotency: missing idempotency key
	// GET /payments: unprotected
}

// LogObserver logs each protected request through log/slog: executions and
// replays at debug level, refusals at info, Redis failures at error.
func ExampleLogObserver() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		// The time and the duration differ from run to run; dropped here so
		// that the output below is always the same.
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == "duration") {
				return slog.Attr{}
			}
			return a
		},
	}))
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:log"),
		idempotency.WithCallerCredentials(),
		idempotency.WithObserver(idempotency.LogObserver(logger)),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))

	pay := func(body string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "order-10-payment")
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	pay(`{"amount":500}`)
	pay(`{"amount":500}`) // a retry
	pay(`{"amount":900}`) // the same key for another payment
	// Output:
	// level=DEBUG msg=idempotency outcome=executed method=POST path=/payments mode=key
	// level=DEBUG msg=idempotency outcome=replayed method=POST path=/payments mode=key from_cache=true
	// level=INFO msg=idempotency outcome=rejected method=POST path=/payments mode=key from_cache=true error="idempotency: key reused for a different request"
}
