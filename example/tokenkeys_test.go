package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/stretchr/testify/require"
)

// A revocation done as docs/operations.md says, on two shop processes:
// every instance is restarted with a new signing key and the old one
// revoked. A form spent before replays its order on every instance; a
// form whose token was never spent is refused (token-not-found) and
// orders nothing; a fresh form orders once.
func TestARevocationThenARollingRestartOrdersNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	redisURL := "REDIS_URL=redis://" + redistest.Private(t).Addr()
	old, next := idempotency.NewTokenKey(), idempotency.NewTokenKey()
	before := "IDEMPOTENCY_TOKEN_KEYS=sign=" + old
	a, b := startProcess(t, redisURL, before), startProcess(t, redisURL, before)
	c := browser(t)
	spent, unspent := formToken(t, c, a.URL), formToken(t, c, a.URL)
	require.Equal(t, "303 false", submit(t, c, b.URL, spent))

	after := "IDEMPOTENCY_TOKEN_KEYS=sign=" + next + " revoked=" + old
	stop(t, a)
	a = startProcess(t, redisURL, after)
	stop(t, b)
	b = startProcess(t, redisURL, after)
	for _, shop := range []*shopproc.Shop{a, b} {
		require.Equal(t, "303 true", submit(t, c, shop.URL, spent), "a form spent before the revocation replays")
		require.Equal(t, "422 false", submit(t, c, shop.URL, unspent), "a form never spent is refused")
	}
	require.Equal(t, 1, countOf[Order](t, a.URL, "/orders"))
	require.Equal(t, "303 false", submit(t, c, b.URL, formToken(t, c, a.URL)))
	require.Equal(t, 2, countOf[Order](t, a.URL, "/orders"))
}

// 400 forms at once whose session rotated after their page was served
// (each token another session's now) are each told token-not-found by one
// instance, with Redis healthy: none 503, nothing ordered.
func TestFormsOfRotatedSessionsAreRefusedAt422(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	shop := startProcess(t, "REDIS_URL=redis://"+redistest.Private(t).Addr())
	tokens := make([]string, 400)
	for i := range tokens {
		tokens[i] = formToken(t, browser(t), shop.URL)
	}
	statuses := make([]int, len(tokens))
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 64}}
	for i, tok := range tokens {
		wg.Go(func() {
			form := url.Values{"item": {"tea"}, "quantity": {"1"}, "idempotency_token": {tok}}
			req, _ := http.NewRequest(http.MethodPost, shop.URL+"/orders", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.AddCookie(&http.Cookie{Name: "idempotency_session", Value: uuid.NewString()}) // rotated
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	for i, s := range statuses {
		require.Equal(t, http.StatusUnprocessableEntity, s, "form %d", i)
	}
	require.Equal(t, 0, countOf[Order](t, shop.URL, "/orders"))
}

// submit posts the order form with tok and says the status and whether
// it was a replay.
func submit(t *testing.T, c *http.Client, base, tok string) string {
	t.Helper()
	resp, err := c.PostForm(base+"/orders", url.Values{"item": {"tea"}, "quantity": {"1"}, "idempotency_token": {tok}})
	require.NoError(t, err)
	resp.Body.Close()
	return fmt.Sprint(resp.StatusCode, " ", resp.Header.Get(idempotency.ReplayedHeader) == "true")
}

// stop ends a shop as a deployment does, and waits for it to exit.
func stop(t *testing.T, s *shopproc.Shop) {
	t.Helper()
	require.NoError(t, s.Signal(syscall.SIGTERM))
	select {
	case <-s.Exited():
	case <-time.After(40 * time.Second):
		t.Fatal("the shop did not stop within 40 s of SIGTERM")
	}
}
