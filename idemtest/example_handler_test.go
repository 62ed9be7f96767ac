package idemtest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/idemtest"
)

// A handler test that shows the three answers a protected route gives
// besides its own: a replay, a key reused for another request (422), and
// Redis down (503, the handler does not run). Below its first line, the
// body is what a test function writes with its own t (with assertions
// instead of prints); the README quotes it.
func ExampleRedis_handlerTest() {
	t := exampleT()
	rdb := idemtest.NewRedis(t) // an in-process Redis, stopped when t ends
	orders := 0
	h := rdb.New(idempotency.WithCallerCredentials()).ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
	}))
	post := func(key, body string) string {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return fmt.Sprint(rec.Code, " replayed=", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println(post("k1", `{"item":"tea"}`))  // runs the handler
	fmt.Println(post("k1", `{"item":"tea"}`))  // the stored answer, replayed
	fmt.Println(post("k1", `{"item":"cake"}`)) // 422: the key names another request
	rdb.SetError("connection refused")         // Redis down until SetError("")
	fmt.Println(post("k2", `{"item":"tea"}`))  // 503: nothing runs
	fmt.Println("orders:", orders)
	// Output:
	// 201 replayed=false
	// 201 replayed=true
	// 422 replayed=false
	// 503 replayed=false
	// orders: 1
}
