package idempotency_test

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// One Middleware per application, configured once: here its keys get a
// prefix of their own, answers are replayed for two hours, and an answer
// that says "try again" (a 503 from a payment provider that is down) is
// not stored, so that the client's retry with the same key runs again.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:new"),
		idempotency.WithCallerCredentials(), // callers are told apart by Authorization, cookies, TLS certificates
		idempotency.WithRecordTTL(2*time.Hour),
		idempotency.WithStoreTimeout(500*time.Millisecond),
		idempotency.WithStorePolicy(idempotency.StoreNoTransient),
	)

	providerUp, charges := false, 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !providerUp {
			http.Error(w, "payment provider unavailable", http.StatusServiceUnavailable)
			return
		}
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})))

	pay := func() {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-8-payment")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	pay()
	providerUp = true
	pay() // the retry runs: the 503 was not stored
	pay() // and this one is answered from the stored 201
	// Output:
	// 503 payment provider unavailable replayed: false
	// 201 charge 1 replayed: false
	// 201 charge 1 replayed: true
}

// Key mode on a plain http.ServeMux: a payment endpoint that clients call
// with their own Idempotency-Key.
func ExampleMiddleware_ProtectKey() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:key"),
		// Callers send an API key: one caller never receives another's answer.
		idempotency.WithScope(idempotency.ScopeByHeader("X-Api-Key")),
	)
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	pay := func(apiKey string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-7-payment")
		req.Header.Set("X-Api-Key", apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	for range 3 { // a client retrying after timeouts
		pay("sk_alice")
	}
	pay("sk_bob") // another caller with the same key and body runs its own request
	// Output:
	// 201 charge 1 replayed: false
	// 201 charge 1 replayed: true
	// 201 charge 1 replayed: true
	// 201 charge 2 replayed: false
}

// Token mode for a script-driven page: it fetches a token from
// TokenHandler, which also starts the visitor's session (a cookie), and
// sends it as the Idempotency-Key of the POST it must not repeat. A token
// belongs to the session it was issued to: another visitor cannot spend it.
func ExampleMiddleware_TokenHandler() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb,
		idempotency.WithKeyPrefix("example:token-handler"),
		idempotency.WithTokenTTL(15*time.Minute),
	)
	orders := 0
	mux := http.NewServeMux()
	mux.Handle("GET /idempotency/token", idem.TokenHandler())
	mux.Handle("POST /orders", idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// visit is a browser opening the page: its cookie jar keeps the session
	// cookie that TokenHandler sets along with the token.
	visit := func() (*http.Client, string) {
		jar, _ := cookiejar.New(nil)
		browser := &http.Client{Jar: jar}
		resp, err := browser.Get(srv.URL + "/idempotency/token")
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		var issued struct {
			Token     string `json:"token"`
			ExpiresIn int    `json:"expires_in"`
		}
		json.NewDecoder(resp.Body).Decode(&issued)
		fmt.Println("token valid for", issued.ExpiresIn, "s, session cookie:", resp.Cookies()[0].Name)
		return browser, issued.Token
	}
	order := func(browser *http.Client, token string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Idempotency-Key", token)
		resp, err := browser.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}

	alice, token := visit()
	order(alice, token) // a double click: the second is answered with the first's response
	order(alice, token)
	bob, _ := visit()
	order(bob, token)
	fmt.Println("orders placed:", orders)
	// Output:
	// token valid for 900 s, session cookie: idempotency_session
	// 201 application/json replayed: false
	// 201 application/json replayed: true
	// token valid for 900 s, session cookie: idempotency_session
	// 422 application/problem+json replayed: false
	// orders placed: 1
}

// Token mode: the page embeds a token in its form, and the POST route
// spends it.
func ExampleMiddleware_Protect() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("example:token"))
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
	token, _, _ := strings.Cut(strings.Split(string(field), `value="`)[1], `"`)
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
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	protect := idempotency.ProtectKey(rdb,
		idempotency.WithKeyPrefix("example:webhook"),
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
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,      // lets WithStoreTimeout cut a stalled Redis short
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("example:form"))
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
