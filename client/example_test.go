package client_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/client"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A client whose first answer is lost on the way back: the payment ran,
// then the connection closed. The Transport sends the request again with
// the key it gave the first attempt, and gets the stored answer instead of
// a second charge. The next payment is a new request with a key of its own.
func ExampleTransport() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("client-example:transport"), idempotency.WithCallerCredentials())
	var charges atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges.Add(1))
	})))
	var lost atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lost.CompareAndSwap(false, true) {
			mux.ServeHTTP(httptest.NewRecorder(), r) // runs and stores the payment
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close() // and the answer never arrives
			}
			return
		}
		mux.ServeHTTP(w, r)
	}))
	defer srv.Close()

	hc := &http.Client{Transport: &client.Transport{}}
	for range 2 {
		resp, err := hc.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":500}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(client.ReplayedHeader) == "true")
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 charge 1 replayed: true
	// 201 charge 2 replayed: false
	// charges: 2
}

// redisAddr is the Redis the example dials: the test suite's own server
// (REDIS_URL, else a private redis-server), under the key prefix
// "client-example:".
var redisAddr = redistest.ExampleAddr("client-example:")
