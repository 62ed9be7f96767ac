package idempotency_test

import (
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// exampleRedis stands in for the application's Redis client; the examples
// run against the test suite's private redis-server.
func exampleRedis() redis.UniversalClient {
	return redis.NewClient(exampleOptions())
}

// Key mode on a plain http.ServeMux: a payment endpoint that clients call
// with their own Idempotency-Key.
func ExampleMiddleware_ProtectKey() {
	idem := idempotency.New(exampleRedis(), idempotency.WithKeyPrefix("example-key"))
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 3 { // a client retrying after timeouts
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-7-payment")
		resp, _ := http.DefaultClient.Do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 charge 1 replayed: false
	// 201 charge 1 replayed: true
	// 201 charge 1 replayed: true
}

// Token mode: the page embeds a token in its form, and the POST route
// spends it.
func ExampleMiddleware_Protect() {
	idem := idempotency.New(exampleRedis(), idempotency.WithKeyPrefix("example-token"))
	r := http.NewServeMux()
	r.Handle("GET /idempotency/token", idem.TokenHandler())
	r.Handle("POST /orders", idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusSeeOther)
	})))

	// What a browser does: fetch the form (here, a token), then submit twice.
	page := httptest.NewRecorder()
	pageReq := httptest.NewRequest(http.MethodGet, "/form", nil)
	field, _ := idem.FormField(page, pageReq)
	token := strings.Split(string(field), `value="`)[1][:36]
	session := page.Result().Cookies()[0]
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders",
			strings.NewReader("item=tea&idempotency_token="+token))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(session)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Location"), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 303 /orders/1 replayed: false
	// 303 /orders/1 replayed: true
}

// Webhooks: the key is the sender's delivery id, scoped by sender so two
// senders' ids never collide.
func ExampleProtectKey() {
	protect := idempotency.ProtectKey(exampleRedis(),
		idempotency.WithKeyPrefix("example-webhook"),
		idempotency.WithKeyExtractor(idempotency.HeaderKey("X-GitHub-Delivery")),
		idempotency.WithScope(func(r *http.Request) (string, error) { return "github", nil }),
	)
	r := http.NewServeMux()
	r.Handle("POST /webhooks/github", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("handling delivery", r.Header.Get("X-GitHub-Delivery"))
	})))
	for range 2 { // GitHub redelivers
		req := httptest.NewRequest(http.MethodPost, "/webhooks/github", strings.NewReader(`{}`))
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// handling delivery 72d3162e-cc78-11e3-81ab-4c9367dc0958
}

// A server-rendered form: FormField issues a token for the visitor's
// session (starting one when needed) and renders it as a hidden input.
func ExampleMiddleware_FormField() {
	idem := idempotency.New(exampleRedis(), idempotency.WithKeyPrefix("example-form"))
	page := template.Must(template.New("order").Parse(
		`<form method="post" action="/orders">{{.Token}}<button>Order</button></form>`))

	w := httptest.NewRecorder()
	field, err := idem.FormField(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if err != nil {
		panic(err)
	}
	page.Execute(w, map[string]any{"Token": field})
	html := w.Body.String()
	fmt.Println(strings.Contains(html, `<input type="hidden" name="idempotency_token" value="`))
	fmt.Println(w.Result().Cookies()[0].Name)
	// Output:
	// true
	// idempotency_session
}
