package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// A queue's push endpoint (here Google Cloud Pub/Sub's push format), which
// redelivers a message until it is acknowledged with a 2xx: the key is the
// message id in the JSON body.
func ExampleJSONKey() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:json"),
		idempotency.WithKeyExtractor(idempotency.JSONKey("message.messageId")),
		// Every message comes from the one subscription: keys are scoped to
		// it rather than to the pusher's credentials, which may change
		// between a delivery and its redelivery.
		idempotency.WithScope(func(*http.Request) (string, error) { return "pubsub:orders", nil }),
		// A redelivery may differ outside the message (its delivery attempt
		// count): the message alone makes it the same request.
		idempotency.WithFingerprint(idempotency.JSONFields("message")),
	)
	fulfilled := 0
	mux := http.NewServeMux()
	mux.Handle("POST /push/orders", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fulfilled++
		fmt.Println("fulfilling order", fulfilled)
		w.WriteHeader(http.StatusNoContent)
	})))

	push := func(messageID string, attempt int) {
		body := fmt.Sprintf(`{"message":{"messageId":%q,"data":"eyJvcmRlciI6NDJ9"},`+
			`"subscription":"projects/shop/subscriptions/orders","deliveryAttempt":%d}`, messageID, attempt)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/push/orders", strings.NewReader(body)))
		fmt.Println(w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	push("2070443601311540", 1)
	push("2070443601311540", 2) // redelivered: the acknowledgement was lost
	push("2070443601311541", 1)
	// Output:
	// fulfilling order 1
	// 204 replayed: false
	// 204 replayed: true
	// fulfilling order 2
	// 204 replayed: false
}
