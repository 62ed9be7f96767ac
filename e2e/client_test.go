package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/onceonly/idempotency"
	"github.com/stretchr/testify/require"
)

// A fault is what the network does to one attempt of a request.
type fault int

const (
	deliver           fault = iota // the request reaches the shop, its answer the page
	loseAnswer                     // the shop runs the request, but the connection resets before its answer arrives
	refuse                         // the connection is refused: nothing reaches the shop
	busy                           // a 409 in-progress with Retry-After: 1, what a duplicate gets while the first still runs
	storedUnavailable              // a replayed 503 with Retry-After: a handler's own answer, stored as the key's
)

// testFetchClient calls idempotentFetch in the page while the tab's network
// (Chrome's request interception) fails chosen attempts, then checks that
// every attempt carried the same key and that the shop ran the request
// once: a lost answer is retried into a replay, not into a second payment.
func (e *env) testFetchClient(t *testing.T) {
	s := e.shop(t, "PAYMENT_LATENCY=100ms")
	tab := newTab(t, e.browser)
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(s.URL+"/"), onHomePage))
	flaky := interceptPosts(t, tab, "/payments", "/orders")

	const (
		payment = `{"amount":500,"currency":"EUR"}`
		order   = `{"item":"Green tea","quantity":2}`
	)
	for _, tc := range []struct {
		name, path, body string
		faults           []fault // by attempt; the ones after are delivered
		attempts         int
		status           int // 0: the call rejected, having given up
		replayed         bool
		waited           time.Duration // at least, as Retry-After asked
		runs             int           // executions the shop counts
	}{
		{"payment delivered", "/payments", payment, nil, 1, 201, false, 0, 1},
		{"payment answer lost", "/payments", payment, []fault{loseAnswer}, 2, 201, true, 0, 1},
		{"payment answer lost twice", "/payments", payment, []fault{loseAnswer, loseAnswer}, 3, 201, true, 0, 1},
		{"payment connection refused", "/payments", payment, []fault{refuse}, 2, 201, false, 0, 1},
		{"payment in progress", "/payments", payment, []fault{busy}, 2, 201, false, time.Second, 1},
		{"payment refused on every attempt", "/payments", payment, []fault{refuse, refuse, refuse, refuse, refuse}, 5, 0, false, 0, 0},
		{"order answer lost (token mode)", "/orders", order, []fault{loseAnswer}, 2, 201, true, 0, 1},
		{"payment replayed 503 not retried", "/payments", payment, []fault{storedUnavailable}, 1, 503, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.count(t, tc.path)
			flaky.plan(tc.faults)
			got, err := chromedp.Run(tab, chromedp.Evaluate[clientResult](fmt.Sprintf(`(async () => {
				const { idempotentFetch, REPLAYED_HEADER } = await import('/static/idempotent-fetch.js');
				const started = performance.now();
				try {
					const res = await idempotentFetch(%q, {
						method: 'POST', headers: { 'Content-Type': 'application/json' }, body: %q,
					}, { baseDelay: 50 });
					return { status: res.status, replayed: res.headers.get(REPLAYED_HEADER) === 'true',
						ms: performance.now() - started };
				} catch (err) {
					return { error: String(err), ms: performance.now() - started };
				}
			})()`, tc.path, tc.body), chromedp.EvalAwaitPromise))
			require.NoError(t, err)
			keys := flaky.attempts()

			require.Equal(t, tc.status, got.Status, "answer (error %q)", got.Error)
			require.Equal(t, tc.replayed, got.Replayed, "Idempotent-Replayed")
			require.GreaterOrEqual(t, got.MS, float64(tc.waited.Milliseconds()), "Retry-After honoured")
			require.Len(t, keys, tc.attempts)
			for _, k := range keys {
				require.Len(t, k, 54, "a token from /idempotency/token")
				require.Equal(t, keys[0], k, "every attempt carries the same key")
			}
			require.Equal(t, tc.runs, s.count(t, tc.path)-before)
		})
	}
}

type clientResult struct {
	Status   int     `json:"status"`
	Replayed bool    `json:"replayed"`
	Error    string  `json:"error"`
	MS       float64 `json:"ms"`
}

// interceptor applies a plan of faults to a tab's POSTs to some paths,
// attempt by attempt.
type interceptor struct {
	mu     sync.Mutex
	faults []fault
	keys   []string // the Idempotency-Key of each attempt
}

func interceptPosts(t *testing.T, tab context.Context, paths ...string) *interceptor {
	in := &interceptor{}
	var patterns []*fetch.RequestPattern
	for _, p := range paths {
		patterns = append(patterns, &fetch.RequestPattern{URLPattern: "*" + p})
	}
	pauseRequests(t, tab, patterns, in.handle)
	return in
}

// plan sets the faults of the next request's attempts.
func (in *interceptor) plan(faults []fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults, in.keys = faults, nil
}

// attempts returns the keys the planned request's attempts carried.
func (in *interceptor) attempts() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.keys
}

func (in *interceptor) handle(ctx context.Context, ev fetch.EventRequestPaused) error {
	if ev.Request.Method != "POST" {
		_, err := chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		return err
	}
	if ev.ResponseStatusCode != 0 || ev.ResponseErrorReason != "" {
		// The response stage, which only a loseAnswer attempt asks for: the
		// shop has answered, and the page never hears it.
		_, err := chromedp.Call(ctx, fetch.FailRequest, fetch.FailRequestParams{
			RequestID: ev.RequestID, ErrorReason: network.ErrorReasonConnectionReset})
		return err
	}
	in.mu.Lock()
	f := deliver
	if n := len(in.keys); n < len(in.faults) {
		f = in.faults[n]
	}
	in.keys = append(in.keys, header(ev.Request, "Idempotency-Key"))
	in.mu.Unlock()

	var err error
	switch f {
	case deliver:
		_, err = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
	case loseAnswer:
		_, err = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{
			RequestID: ev.RequestID, InterceptResponse: ptr(true)})
	case refuse:
		_, err = chromedp.Call(ctx, fetch.FailRequest, fetch.FailRequestParams{
			RequestID: ev.RequestID, ErrorReason: network.ErrorReasonConnectionRefused})
	case busy, storedUnavailable:
		// The middleware's own answer to a duplicate that waited too long,
		// or the replay of a handler's 503 that the default policy stored.
		rec := httptest.NewRecorder()
		if f == busy {
			idempotency.DefaultErrorHandler(rec, nil, idempotency.ErrInProgress)
		} else {
			rec.Header().Set("Retry-After", "1")
			rec.Header().Set(idempotency.ReplayedHeader, "true")
			rec.WriteHeader(http.StatusServiceUnavailable)
			rec.WriteString("the payment provider is down")
		}
		var headers []*fetch.HeaderEntry
		for name := range rec.Header() {
			headers = append(headers, &fetch.HeaderEntry{Name: name, Value: rec.Header().Get(name)})
		}
		_, err = chromedp.Call(ctx, fetch.FulfillRequest, fetch.FulfillRequestParams{
			RequestID: ev.RequestID, ResponseCode: int64(rec.Code), ResponseHeaders: headers, Body: rec.Body.Bytes()})
	}
	return err
}

func ptr[T any](v T) *T { return &v }
