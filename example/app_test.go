package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m, func() { removeBinary() }) }

// startShop serves the example app on rdb, as `go run ./example` would.
func startShop(t *testing.T, rdb redis.UniversalClient, cfg config) *httptest.Server {
	app, _, err := newApp(onRedis(rdb), cfg, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	return srv
}

func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var hiddenToken = regexp.MustCompile(`name="idempotency_token" value="([A-Za-z0-9_-]{54})"`)

// formToken loads the home page and returns the token of its order form.
func formToken(t *testing.T, c *http.Client, base string) string {
	resp, err := c.Get(base + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	m := hiddenToken.FindSubmatch(page)
	require.NotNil(t, m, "the form carries a hidden token")
	return string(m[1])
}

func countOf[T any](t *testing.T, base, path string) int {
	resp, err := http.Get(base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	var items []T
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&items))
	return len(items)
}

func TestDoubleClickedFormPlacesOneOrder(t *testing.T) {
	rdb := redistest.Client(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{orderLatency: 200 * time.Millisecond})
	c := browser(t)
	tok := formToken(t, c, srv.URL)
	form := url.Values{"item": {"Green tea"}, "quantity": {"2"}, "idempotency_token": {tok}}

	// Two submissions 50 ms apart while the back end takes 200 ms.
	var wg sync.WaitGroup
	locations := make([]string, 2)
	statuses := make([]int, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 50 * time.Millisecond)
			resp, err := c.PostForm(srv.URL+"/orders", form)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			statuses[i], locations[i] = resp.StatusCode, resp.Header.Get("Location")
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, []int{http.StatusSeeOther, http.StatusSeeOther}, statuses)
	require.Equal(t, locations[0], locations[1])
	require.Equal(t, 1, countOf[Order](t, srv.URL, "/orders"))

	// Back, then submit the same page again: still the same order.
	resp, err := c.PostForm(srv.URL+"/orders", form)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, locations[0], resp.Header.Get("Location"))
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))

	req, _ := http.NewRequest(http.MethodGet, srv.URL+locations[0], nil)
	req.Header.Set("Accept", "text/html")
	resp, err = c.Do(req)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(page), "2 × Green tea")
}

func TestJSONOrdersAndPayments(t *testing.T) {
	rdb := redistest.Client(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{paymentLatency: 50 * time.Millisecond})
	// A second instance behind the same Redis is the same shop.
	other := startShop(t, rdb, config{paymentLatency: 50 * time.Millisecond})
	c := browser(t)

	tokResp, err := c.Get(srv.URL + "/idempotency/token")
	require.NoError(t, err)
	var tok struct {
		Token     string `json:"token"`
		ExpiresIn int    `json:"expires_in"`
	}
	require.NoError(t, json.NewDecoder(tokResp.Body).Decode(&tok))
	tokResp.Body.Close()
	require.Equal(t, 3600, tok.ExpiresIn)

	// tryPost may run on any goroutine; post, on the test's only.
	tryPost := func(base, path, key, body string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		return resp, nil
	}
	post := func(base, path, key, body string) *http.Response {
		resp, err := tryPost(base, path, key, body)
		require.NoError(t, err)
		return resp
	}
	first := post(srv.URL, "/orders", tok.Token, `{"item":"tea","quantity":1}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, "/orders/1", first.Header.Get("Location"))
	again := post(other.URL, "/orders", tok.Token, `{"item":"tea","quantity":1}`)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusBadRequest, post(srv.URL, "/orders", "", `{}`).StatusCode)

	// Ten concurrent retries of one payment, spread over both instances.
	var wg sync.WaitGroup
	statuses := make([]int, 10)
	errs := make([]error, 10)
	for i := range 10 {
		base := []string{srv.URL, other.URL}[i%2]
		wg.Go(func() {
			resp, err := tryPost(base, "/payments", "pay-1", `{"amount":500,"currency":"eur"}`)
			if err != nil {
				errs[i] = err
				return
			}
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for _, status := range statuses {
		require.Equal(t, http.StatusCreated, status)
	}
	require.Equal(t, http.StatusCreated, post(srv.URL, "/payments", "pay-2", `{"amount":700,"currency":"eur"}`).StatusCode)
	require.Equal(t, 2, countOf[Payment](t, other.URL, "/payments"))
	require.Equal(t, 1, countOf[Order](t, other.URL, "/orders"))
}

func TestEmbeddedRedisNeedsNoSetUp(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("REDIS_CLUSTER_ADDRS", "")
	rdb, closeRedis, err := connect()
	require.NoError(t, err)
	defer closeRedis()
	srv := startShop(t, rdb, config{})
	submitTwice(t, browser(t), srv.URL)
	require.Equal(t, 1, countOf[Order](t, srv.URL, "/orders"))
}

// A request the shop refuses before it does anything (a form with an item
// of spaces, a payment with a negative amount) gives its token or key
// back: the corrected request, sent again with it, runs. Text that a
// store could not keep is refused alike, whatever the store.
func TestARefusedRequestGivesItsKeyBack(t *testing.T) {
	rdb := redistest.Client(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{})
	c := browser(t)
	token := formToken(t, c, srv.URL)
	for _, item := range []string{"   ", "te\x00a", "\xff\xfe"} {
		resp, err := c.PostForm(srv.URL+"/orders", url.Values{"item": {item}, "quantity": {"1"}, "idempotency_token": {token}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q", item)
	}
	resp, err := c.PostForm(srv.URL+"/orders", url.Values{"item": {"Green tea"}, "quantity": {"1"}, "idempotency_token": {token}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, countOf[Order](t, srv.URL, "/orders"))

	for _, tc := range []struct{ path, bad, good string }{
		{"/payments", `{"amount":-1,"currency":"eur"}`, `{"amount":1,"currency":"eur"}`},
		{"/payments", `{"amount":1,"currency":"e\u0000r"}`, `{"amount":1,"currency":"eur"}`},
		{"/callbacks/orders", `{"order":1,"status":"pa\u0000id"}`, `{"order":1,"status":"paid"}`},
		{"/callbacks/orders", `{"order":1,"status":"` + strings.Repeat("x", 70_000) + `"}`, `{"order":1,"status":"paid"}`},
	} {
		key := "refused-" + strconv.Itoa(len(tc.bad))
		bad := postJSON(t, srv.URL+tc.path, key, tc.bad)
		require.Equal(t, http.StatusBadRequest, bad.status, bad.body)
		good := postJSON(t, srv.URL+tc.path, key, tc.good)
		require.Less(t, good.status, 300, good.body)
		require.Empty(t, good.replayed)
	}

	head, err := http.Head(srv.URL + "/orders")
	require.NoError(t, err)
	head.Body.Close()
	require.Equal(t, http.StatusOK, head.StatusCode)
}

// submitTwice loads the order form and posts it twice in a row, as a user
// resubmitting it does.
func submitTwice(t *testing.T, c *http.Client, base string) {
	form := url.Values{"item": {"tea"}, "quantity": {"1"}, "idempotency_token": {formToken(t, c, base)}}
	for range 2 {
		resp, err := c.PostForm(base+"/orders", form)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	}
}

func TestShopOnRedisCluster(t *testing.T) {
	rdb := redistest.Cluster(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{})
	for range 5 {
		submitTwice(t, browser(t), srv.URL) // a session each: spread over shards
	}
	require.Equal(t, 5, countOf[Order](t, srv.URL, "/orders"))
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("ORDER_LATENCY", "250ms")
	t.Setenv("ADDR", "127.0.0.1:9999")
	cfg, err := configFromEnv()
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, cfg.orderLatency)
	require.Equal(t, 300*time.Millisecond, cfg.paymentLatency)
	require.Equal(t, 10*time.Millisecond, cfg.callbackLatency)
	require.Equal(t, "127.0.0.1:9999", cfg.addr)
	t.Setenv("PAYMENT_LATENCY", "soon")
	_, err = configFromEnv()
	require.ErrorContains(t, err, "PAYMENT_LATENCY")
}

func TestConcurrentCancelsChangeTheOrderOnce(t *testing.T) {
	rdb := redistest.Client(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{})
	other := startShop(t, rdb, config{})
	submitTwice(t, browser(t), srv.URL)

	statuses := make(chan int, 10)
	errs := make([]error, 10)
	var wg sync.WaitGroup
	for i := range 10 {
		base := []string{srv.URL, other.URL}[i%2]
		wg.Go(func() {
			resp, err := http.Post(base+"/orders/1/cancel", "application/json", nil)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	require.NoError(t, errors.Join(errs...))
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: 9}, counts)

	resp, err := http.Get(srv.URL + "/orders/1")
	require.NoError(t, err)
	var o Order
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	resp.Body.Close()
	require.Equal(t, "cancelled", o.Status)
	require.EqualValues(t, 2, o.Version, "created at 1, cancelled once")

	resp, err = http.Post(srv.URL+"/orders/99/cancel", "application/json", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// While Redis is down, pages that only read answer 503 with Retry-After at
// once, as the protected routes do.
func TestReadsFailFastWhileRedisIsDown(t *testing.T) {
	dead := redistest.Private(t)
	rdb := dead.Client(t)
	srv := startShop(t, rdb, config{})
	dead.Stop()
	for _, path := range []string{"/orders", "/payments", "/orders/1"} {
		began := time.Now()
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, path)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Less(t, time.Since(began), 1500*time.Millisecond, path)
	}
}

// The router's own answers are problems too, and a 405 names the methods
// the address does answer, for unknown methods as well.
func TestRouterAnswersProblems(t *testing.T) {
	srv := startShop(t, redistest.Client(t, "shop:"), config{})
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/nowhere", http.StatusNotFound, ""},
		{http.MethodDelete, "/orders", http.StatusMethodNotAllowed, "GET, POST"},
		{"BREW", "/orders", http.StatusMethodNotAllowed, "GET, POST"},
		{http.MethodGet, "/orders/1/cancel", http.StatusMethodNotAllowed, "POST"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, tc.status, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Equal(t, tc.allow, resp.Header.Get("Allow"), "%s %s", tc.method, tc.path)
	}
}

// A payment retried with its JSON in another order is the same payment.
func TestPaymentRetryWithReorderedJSONReplays(t *testing.T) {
	rdb := redistest.Client(t, "shop:")
	redistest.DeletePrefix(t, rdb, "shop:")
	srv := startShop(t, rdb, config{})
	pay := func(body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "reordered-"+t.Name())
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	require.Equal(t, http.StatusCreated, pay(`{"amount":500,"currency":"eur"}`).StatusCode)
	again := pay(`{ "currency": "eur", "amount": 500 }`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, countOf[Payment](t, srv.URL, "/payments"))
}

// A listing that is merely large is not taken for a Redis that is down:
// after a long soak (tens of thousands of orders and payments), the
// listings and the order page still answer 200 with every record, while a
// Redis that does not answer still gets 503 at once
// (TestReadsFailFastWhileRedisIsDown).
func TestListingsOfTensOfThousandsAnswer(t *testing.T) {
	const n = 40_000
	rdb := redistest.Private(t).Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	created := time.Date(2026, 11, 23, 16, 23, 59, 0, time.UTC)
	for first := int64(1); first <= n; first += 1000 {
		pipe := rdb.Pipeline()
		for id := first; id < first+1000 && id <= n; id++ {
			// As addOrder and capturePayment store them: a hash each (an
			// order's at version 1), indexed in a sorted set.
			pipe.HSet(ctx, orderKey(id), "item", "tea", "quantity", 2, "status", "placed",
				"created_at", created.Format(time.RFC3339Nano), "version", 1)
			pipe.ZAdd(ctx, ordersIndex, redis.Z{Score: float64(id), Member: id})
			pay := paymentID(strconv.FormatInt(id, 10))
			pipe.HSet(ctx, paymentKey(pay), "amount", 500, "currency", "EUR", "status", "captured",
				"created_at", created.Format(time.RFC3339Nano), "fence", id)
			pipe.ZAdd(ctx, paymentsIndex, redis.Z{Score: float64(created.UnixNano() + id), Member: pay})
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, rdb.Set(ctx, ordersSeq, n, 0).Err())

	srv := startShop(t, rdb, config{})
	client := &http.Client{Timeout: 2 * time.Minute}
	get := func(path string) *http.Response {
		resp, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		return resp
	}
	var orders []Order
	require.NoError(t, json.NewDecoder(get("/orders").Body).Decode(&orders))
	require.Len(t, orders, n)
	last := orders[n-1]
	require.Equal(t, Order{ID: n, Item: "tea", Quantity: 2, Status: "placed", Version: 1}, Order{ID: last.ID,
		Item: last.Item, Quantity: last.Quantity, Status: last.Status, Version: last.Version})
	require.True(t, created.Equal(last.CreatedAt))

	var payments []Payment
	require.NoError(t, json.NewDecoder(get("/payments").Body).Decode(&payments))
	require.Len(t, payments, n)
	require.Equal(t, int64(500), payments[n-1].Amount)

	page, err := io.ReadAll(get("/").Body)
	require.NoError(t, err)
	require.Contains(t, string(page), `<span class="count" id="order-count">40000</span>`)
}
