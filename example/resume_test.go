package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/example/internal/provider"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/stretchr/testify/require"
)

// An instance killed in the middle of payments (SIGKILL: no drain, nothing
// kept), each at another point of its run, leaves them claimed, some
// charged at the provider and none answered. Retried on another instance, every payment is resumed once its
// run can no longer store: no retry is answered interrupted, each gets its
// 201, and the provider, which runs apart from the killed process, charged
// each payment once.
func TestSIGKILLMidPaymentIsResumedOnAnotherInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	killMidPayments(t, "REDIS_URL=redis://"+redistest.Private(t).Addr())
}

// The same with every key in SQL (IDEMPOTENCY_STORE): on SQLite the two
// instances are two processes on one file.
func TestSIGKILLMidPaymentIsResumedOnSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	for _, kind := range []sqltest.Kind{sqltest.SQLite, sqltest.PostgreSQL, sqltest.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			killMidPayments(t, "IDEMPOTENCY_STORE="+storeURL(t, kind), "REDIS_URL=", "REDIS_CLUSTER_ADDRS=",
				"DATABASE_URL=", "DB_PATH=")
		})
	}
}

// killMidPayments kills an instance of two on store (their environment)
// in the middle of payments, and retries each on the other.
func killMidPayments(t *testing.T, store ...string) {
	a, b, charges, srv := twoShopsOfAProvider(t, store...)

	const n = 5
	// The payments start 120 ms apart, so that the kill finds each at
	// another point of its 500 ms call to the provider, or past it: 200,
	// 320 and 440 ms into the call, and 60 and 180 ms after it answered
	// (its step journaled, the payment being written and its answer
	// stored).
	const gap = 120 * time.Millisecond
	for i := range n {
		go pay(t, a.URL, fmt.Sprint("killed-", i)) // its answer may never come
		if i < n-1 {
			time.Sleep(gap)
		}
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, a.Signal(syscall.SIGKILL))
	killed := time.Now()
	<-a.Exited()

	paid := map[string]Payment{}
	deadline := time.Now().Add(90 * time.Second)
	for i := range n {
		key := fmt.Sprint("killed-", i)
		for {
			status, body, err := pay(t, b.URL, key)
			require.NoError(t, err)
			require.NotContains(t, body, "interrupted", key)
			if status == http.StatusCreated {
				var p Payment
				require.NoError(t, json.Unmarshal([]byte(body), &p), body)
				paid[key] = p
				t.Logf("%s: 201 on the other instance %v after the kill", key, time.Since(killed).Round(10*time.Millisecond))
				break
			}
			require.Equal(t, http.StatusConflict, status, body)
			require.Contains(t, body, "in-progress", "the dead run is waited for until nothing can store for it")
			require.True(t, time.Now().Before(deadline), "%s was not resumed in time", key)
			time.Sleep(200 * time.Millisecond)
		}
	}

	var made []provider.Charge
	resp, err := http.Get(srv.URL + "/charges")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&made))
	require.Len(t, made, n, "one charge per payment")
	t.Logf("the provider was asked for %d charges and made %d", charges.Calls(), len(made))
	for key, p := range paid {
		require.True(t, strings.HasPrefix(p.Charge, "ch_"), "%s: %+v", key, p)
		for _, other := range paid {
			if other.ID != p.ID {
				require.NotEqual(t, p.Charge, other.Charge)
			}
		}
	}
	require.Equal(t, n, countOf[Payment](t, b.URL, "/payments"))
}

// A retry of a payment whose instance was killed is told when to ask
// again: Retry-After is the time left until nothing can store for the dead
// run (its claim horizon), not one lease; a client that waits that long
// then gets its payment, resumed, instead of a dozen 409s.
func TestRetryAfterAKilledInstanceSaysWhenToAskAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	a, b, _, _ := twoShopsOfAProvider(t, "REDIS_URL=redis://"+redistest.Private(t).Addr())
	go pay(t, a.URL, "killed") // its answer never comes
	time.Sleep(250 * time.Millisecond)
	require.NoError(t, a.Signal(syscall.SIGKILL))
	<-a.Exited()

	ask := func() (int, time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, b.URL+"/payments", strings.NewReader(`{"amount":500,"currency":"eur"}`))
		req.Header.Set("Idempotency-Key", "killed")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return resp.StatusCode, time.Duration(secs) * time.Second
	}
	type pageAnswer struct {
		status                        int
		contentType, retryAfter, page string
	}
	browsed := make(chan pageAnswer, 1)
	go func() {
		// Behind the API client's request, which leads the key's flight in
		// b: a follower whose own wait ends first is told to come back
		// after a lease, not the horizon.
		time.Sleep(300 * time.Millisecond)
		req, _ := http.NewRequest(http.MethodPost, b.URL+"/payments", strings.NewReader(`{"amount":500,"currency":"eur"}`))
		req.Header.Set("Idempotency-Key", "killed")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			browsed <- pageAnswer{page: err.Error()}
			return
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		browsed <- pageAnswer{resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"), string(page)}
	}()
	status, after := ask()
	browser := <-browsed
	require.Equal(t, http.StatusConflict, status)
	require.Greater(t, after, 2*time.Second, "more than the payments' lease (1 s): the dead run cannot answer")
	require.LessOrEqual(t, after, 15*time.Second, "no more than the claim horizon")
	// A browser, asking at about the same time, is told it as a page a
	// person can read.
	require.Equal(t, http.StatusConflict, browser.status, "%s", browser.page)
	require.Equal(t, "text/html; charset=utf-8", browser.contentType)
	require.Contains(t, browser.page, "Try again in "+browser.retryAfter+" seconds")
	time.Sleep(after)
	tries := 1
	for status, after = ask(); status == http.StatusConflict && tries < 3; status, after = ask() {
		tries++
		time.Sleep(after)
	}
	require.Equal(t, http.StatusCreated, status, "resumed once Retry-After had passed")
	require.LessOrEqual(t, tries, 2, "at most one more 409 after waiting as told")
}

// twoShopsOfAProvider starts two shop processes on a private Redis, whose
// payments charge one payment provider that runs apart from them (500 ms
// a charge), served at srv.
func twoShopsOfAProvider(t *testing.T, store ...string) (a, b *shopproc.Shop, charges *provider.Provider, srv *httptest.Server) {
	t.Helper()
	charges = &provider.Provider{Latency: 500 * time.Millisecond}
	srv = httptest.NewServer(charges)
	t.Cleanup(srv.Close)
	env := append(store, "PROVIDER_URL="+srv.URL, "PAYMENT_LATENCY=500ms")
	return startProcess(t, env...), startProcess(t, env...), charges, srv
}
