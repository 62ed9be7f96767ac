package idempotency_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// An API with problem types of its own answers a key reused for another
// request in its own words, and leaves every other refusal to
// DefaultErrorHandler. The errors match the package's sentinels with
// errors.Is; their text is for logs, never for clients.
func ExampleWithErrorHandler() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:errors"),
		idempotency.WithCallerCredentials(),
		idempotency.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(err, idempotency.ErrKeyReused) {
				idempotency.DefaultErrorHandler(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			json.NewEncoder(w).Encode(struct {
				Type   string `json:"type"`
				Title  string `json:"title"`
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}{
				Type:   "https://api.example.com/problems/payment-key-reused",
				Title:  "Payment key already used",
				Status: http.StatusUnprocessableEntity,
				Detail: "This Idempotency-Key paid for another amount; use a new key for a new payment.",
			})
		}),
	)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"payment":"pay_1"}`)
	})))

	pay := func(key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Content-Type"), strings.TrimSpace(w.Body.String()))
	}
	pay("order-11-payment", `{"amount":500}`)
	pay("order-11-payment", `{"amount":900}`) // the same key, other input
	pay("", `{"amount":900}`)                 // no key: the default answer
	// Output:
	// 201 application/json {"payment":"pay_1"}
	// 422 application/problem+json {"type":"https://api.example.com/problems/payment-key-reused","title":"Payment key already used","status":422,"detail":"This Idempotency-Key paid for another amount; use a new key for a new payment."}
	// 400 application/problem+json {"type":"https://github.com/onceonly/idempotency/blob/main/README.md#problem-missing-key","title":"Idempotency key missing","status":400,"detail":"This endpoint requires an idempotency key or token."}
}
