package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

const (
	submit = `form.order button[type=submit]`
	// orderLatency keeps the shop's order handler busy, so the second click
	// of a multi-click reaches it while the first one still runs.
	orderLatency = 400 * time.Millisecond
	clickGap     = 100 * time.Millisecond
)

// multiClick clicks the order button n times, clickGap apart, and returns
// the log of the tab's requests. The answers are held until the browser has
// sent all n POSTs, so that no click comes too late, after the page
// navigated, however slow the machine. Once per tab: it intercepts the
// tab's requests.
func multiClick(t *testing.T, tab context.Context, n int) *requestLog {
	log := logRequests(t, tab)
	hold := holdAnswers(t, tab, "/orders")
	require.NoError(t, chromedp.Do(tab, clicks(submit, n, clickGap)))
	require.Eventually(t, func() bool { return len(log.sent("POST", "/orders")) >= n },
		5*time.Second, 10*time.Millisecond, "the browser sends a POST per click")
	hold.release(tab)
	require.NoError(t, chromedp.Do(tab, onOrderPage))
	return log
}

// testClicks multi-clicks the order button. Every click submits the form
// (the browser sends each POST and aborts the one before), so without the
// middleware each click is an order; with it, the form's one token makes
// them one. The rows with protection off are what make the others mean
// something: the same clicks on the same page, minus the middleware.
func (e *env) testClicks(t *testing.T) {
	for _, tc := range []struct {
		name          string
		clicks        int
		protectionOff bool
		orders        int
	}{
		{"double click", 2, false, 1},
		{"double click without the middleware", 2, true, 2},
		{"triple click", 3, false, 1},
		{"triple click without the middleware", 3, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			environ := []string{"ORDER_LATENCY=" + orderLatency.String()}
			if tc.protectionOff {
				environ = append(environ, "IDEMPOTENCY_DISABLED=1")
			}
			s := e.shop(t, environ...)
			tab := newTab(t, e.browser)
			require.NoError(t, chromedp.Do(tab, chromedp.Navigate(s.URL+"/"), onHomePage))
			banner, err := chromedp.Run(tab, chromedp.Evaluate[bool](`!!document.getElementById('unprotected')`))
			require.NoError(t, err)
			require.Equal(t, tc.protectionOff, banner, "the page warns when protection is off")

			log := multiClick(t, tab, tc.clicks)
			require.Len(t, log.sent("POST", "/orders"), tc.clicks)
			redirects := log.redirects()
			require.Len(t, redirects, 1, "the page followed the last POST's redirect")
			require.Equal(t, !tc.protectionOff, replayed(redirects[0]),
				"protected, the last click's answer is the first click's, replayed")
			// The handlers of aborted POSTs run on: the middleware detaches
			// them from the client, and so does the unprotected variant. A
			// protected page has them all answered by the time it navigates,
			// so a second order would show within their latency.
			time.Sleep(orderLatency)
			require.Equal(t, tc.orders, s.settledCount(t, "/orders", tc.orders))
		})
	}
}

// testBackAndResubmit submits the form, goes back to it and submits it
// again. Back shows the form as it was, token included, whether the browser
// restores the page from its back-forward cache or reloads it from its HTTP
// cache (which the home page's Cache-Control allows), so the second POST
// gets the first one's answer replayed and lands on the same order.
func (e *env) testBackAndResubmit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		browser func(t *testing.T) context.Context
	}{
		{"restored from the back-forward cache", func(*testing.T) context.Context { return e.browser }},
		{"reloaded from the HTTP cache", func(t *testing.T) context.Context {
			return startBrowser(t, chromedp.Flag("disable-features", "BackForwardCache"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.shop(t, "ORDER_LATENCY=100ms")
			tab := newTab(t, tc.browser(t))
			log := logRequests(t, tab)

			require.NoError(t, chromedp.Do(tab, chromedp.Navigate(s.URL+"/")))
			var landed []string
			for i := range 2 {
				if i > 0 {
					// Back once the evaluation has answered: a navigation
					// that starts first can cut the answer off ("Inspected
					// target navigated or closed"), as it does on a busy
					// machine. onHomePage waits for the page either way.
					require.NoError(t, chromedp.Do(tab, chromedp.Evaluate[chromedp.Void](`setTimeout(() => history.back())`), onHomePage))
				}
				require.NoError(t, chromedp.Do(tab, clicks(submit, 1, 0), onOrderPage))
				location, err := chromedp.Run(tab, chromedp.Location())
				require.NoError(t, err)
				landed = append(landed, location)
			}
			require.Equal(t, s.URL+"/orders/1", landed[0])
			require.Equal(t, landed[0], landed[1], "the resubmission lands on the first order")

			sent := log.sent("POST", "/orders")
			require.Len(t, sent, 2)
			require.NotEmpty(t, formField(t, sent[0], "idempotency_token"))
			require.Equal(t, formField(t, sent[0], "idempotency_token"), formField(t, sent[1], "idempotency_token"),
				"Back shows the form that was submitted, token included")
			redirects := log.redirects()
			require.Len(t, redirects, 2)
			require.False(t, replayed(redirects[0]))
			require.True(t, replayed(redirects[1]), "the resubmission's answer is the first one, replayed")
			require.Equal(t, 1, s.count(t, "/orders"))
		})
	}
}

// testTwoTabs opens the shop in two tabs of one browser (one session
// cookie) and submits both forms at once: each form has its own token, so
// each is an order.
func (e *env) testTwoTabs(t *testing.T) {
	s := e.shop(t, "ORDER_LATENCY=200ms")
	first := newTab(t, e.browser)
	second := siblingTab(t, first)

	tabs := []context.Context{first, second}
	tokens := make([]string, len(tabs))
	for i, tab := range tabs {
		require.NoError(t, chromedp.Do(tab, chromedp.Navigate(s.URL+"/"), onHomePage))
		token, err := chromedp.Run(tab, chromedp.Evaluate[string](
			`document.querySelector('input[name=idempotency_token]').value`))
		require.NoError(t, err)
		tokens[i] = token
	}
	require.NotEqual(t, tokens[0], tokens[1], "each page load issues a token of its own")

	landed := make([]string, len(tabs))
	errs := make([]error, len(tabs))
	var wg sync.WaitGroup
	for i, tab := range tabs {
		wg.Go(func() {
			errs[i] = chromedp.Do(tab, clicks(submit, 1, 0), onOrderPage)
			if errs[i] == nil {
				landed[i], errs[i] = chromedp.Run(tab, chromedp.Location())
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.NotEqual(t, landed[0], landed[1])
	require.Equal(t, 2, s.count(t, "/orders"))
}
