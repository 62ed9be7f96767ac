package admin_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// An instance stopped between running a payment and storing its answer
// (here a handler that panicked after its status went out), so its key
// answers 409 interrupted. The operator finds the key, learns elsewhere
// that the payment did not go through, and forgets the key: the retry runs.
func ExampleOperator_Interrupted() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("admin-example:payments"), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	crash := true
	pay := idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		if crash {
			panic(http.ErrAbortHandler)
		}
		fmt.Fprint(w, "paid")
	}))
	send := func() *httptest.ResponseRecorder {
		defer func() { recover() }()
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":500}`))
		req.Header.Set(idempotency.KeyHeader, "pay-7f3a")
		w := httptest.NewRecorder()
		pay.ServeHTTP(w, req)
		return w
	}
	send()
	crash = false
	fmt.Println("retry:", send().Code)

	ops := admin.New(idem)
	ctx := context.Background()
	for st, err := range ops.Interrupted(ctx) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("interrupted:", st.State, "executions:", st.Executions)
		if err := ops.Forget(ctx, st); err != nil {
			fmt.Println(err)
		}
	}
	w := send()
	fmt.Println("retry:", w.Code, w.Body.String())
	// Output:
	// retry: 409
	// interrupted: run executions: 1
	// retry: 201 paid
}

// redisAddr is the Redis the example dials: the test suite's own server
// (REDIS_URL, else a private redis-server), under the key prefix
// "admin-example:".
var redisAddr = redistest.ExampleAddr("admin-example:")
