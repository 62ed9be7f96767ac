package cloudevents_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/cloudevents"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// An event consumer that receives CloudEvents over HTTP (Knative, Eventarc,
// Dapr): a sender delivers an event again when it got no 2xx for it, so the
// consumer keys on the event's id, scoped to its source. Binary-mode events
// carry the id in the ce-id header, structured-mode ones in the JSON body;
// both are read.
func ExampleKey() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("cloudevents-example:events"),
		idempotency.WithKeyExtractor(cloudevents.Key),
		idempotency.WithScope(cloudevents.Scope),
		idempotency.WithFingerprint(cloudevents.Fingerprint),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /events", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("handling event")
		w.WriteHeader(http.StatusAccepted)
	})))

	deliver := func(req *http.Request) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	binary := func() *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(`{"order":42}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Ce-Specversion", "1.0")
		req.Header.Set("Ce-Type", "com.example.order.created")
		req.Header.Set("Ce-Source", "/shop/orders")
		req.Header.Set("Ce-Id", "order-42-created")
		return req
	}
	deliver(binary())
	deliver(binary()) // redelivered: the sender missed the first answer

	structured := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(`{
		"specversion": "1.0", "type": "com.example.order.paid", "source": "/shop/orders",
		"id": "order-42-paid", "datacontenttype": "application/json", "data": {"order": 42}}`))
	structured.Header.Set("Content-Type", "application/cloudevents+json")
	deliver(structured)
	// Output:
	// handling event
	// 202 replayed: false
	// 202 replayed: true
	// handling event
	// 202 replayed: false
}

// redisAddr is the Redis the example dials: the test suite's own server
// (REDIS_URL, else a private redis-server), under the key prefix
// "cloudevents-example:".
var redisAddr = redistest.ExampleAddr("cloudevents-example:")
