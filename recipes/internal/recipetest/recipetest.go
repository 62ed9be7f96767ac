// Package recipetest proves a recipe through real HTTP against a real Redis:
// each scenario starts the recipe's router on an httptest server, with Shop
// behind both protected routes, and counts the Shop's runs.
package recipetest

import (
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A Recipe builds a router whose POST /orders (token mode) and POST
// /payments (key mode) run shop, keeping state in the Redis at redisAddr.
type Recipe func(redisAddr string, shop *Shop) http.Handler

// Run runs every scenario against recipe.
func Run(t *testing.T, recipe Recipe) {
	t.Run("duplicate key replays", func(t *testing.T) { duplicateKeyReplays(t, recipe) })
	t.Run("token is spent once", func(t *testing.T) { tokenSpentOnce(t, recipe) })
	t.Run("reused key with another body", func(t *testing.T) { reusedKeyRefused(t, recipe) })
	t.Run("concurrent duplicates run once", func(t *testing.T) { concurrentRunOnce(t, recipe) })
	t.Run("error answer replays", func(t *testing.T) { errorAnswerReplays(t, recipe) })
}

// Serve starts recipe on an httptest server against the test Redis, and
// deletes the middleware's keys when t ends.
func Serve(t *testing.T, recipe Recipe) (*httptest.Server, *Shop) {
	t.Helper()
	rdb := redistest.Client(t, "idem:") // the middleware's default key prefix
	shop := new(Shop)
	srv := httptest.NewServer(recipe(rdb.(*redis.Client).Options().Addr, shop))
	t.Cleanup(srv.Close)
	return srv, shop
}

func duplicateKeyReplays(t *testing.T, recipe Recipe) {
	srv, shop := Serve(t, recipe)
	first, err := Post(srv.Client(), srv.URL+"/payments", "pay-1", `{"amount":500}`)
	require.NoError(t, err)
	second, err := Post(srv.Client(), srv.URL+"/payments", "pay-1", `{"amount":500}`)
	require.NoError(t, err)

	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	require.False(t, first.Replayed)
	require.Equal(t, http.StatusCreated, second.Status, second.Body)
	require.True(t, second.Replayed, "Idempotent-Replayed on the duplicate")
	require.JSONEq(t, first.Body, second.Body)
	require.EqualValues(t, 1, shop.Runs())
}

func tokenSpentOnce(t *testing.T, recipe Recipe) {
	srv, shop := Serve(t, recipe)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar}

	token, err := fetchToken(browser, srv.URL+"/idempotency/token")
	require.NoError(t, err)
	first, err := Post(browser, srv.URL+"/orders", token, `{"amount":2}`)
	require.NoError(t, err)
	second, err := Post(browser, srv.URL+"/orders", token, `{"amount":2}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	require.False(t, first.Replayed)
	require.Equal(t, http.StatusCreated, second.Status, second.Body)
	require.True(t, second.Replayed, "Idempotent-Replayed on the second POST")
	require.JSONEq(t, first.Body, second.Body)
	require.EqualValues(t, 1, shop.Runs())

	// A fresh token is a new order.
	token, err = fetchToken(browser, srv.URL+"/idempotency/token")
	require.NoError(t, err)
	third, err := Post(browser, srv.URL+"/orders", token, `{"amount":2}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, third.Status, third.Body)
	require.False(t, third.Replayed)
	require.EqualValues(t, 2, shop.Runs())
}

func reusedKeyRefused(t *testing.T, recipe Recipe) {
	srv, shop := Serve(t, recipe)
	first, err := Post(srv.Client(), srv.URL+"/payments", "pay-2", `{"amount":500}`)
	require.NoError(t, err)
	reused, err := Post(srv.Client(), srv.URL+"/payments", "pay-2", `{"amount":900}`)
	require.NoError(t, err)

	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	require.Equal(t, http.StatusUnprocessableEntity, reused.Status, reused.Body)
	require.True(t, strings.HasPrefix(reused.ContentType, "application/problem+json"), reused.ContentType)
	require.EqualValues(t, 1, shop.Runs())
}

func concurrentRunOnce(t *testing.T, recipe Recipe) {
	srv, shop := Serve(t, recipe)
	const callers = 20
	type result struct {
		Answer
		err error
	}
	results := make(chan result, callers)
	for range callers {
		go func() {
			a, err := Post(srv.Client(), srv.URL+"/payments", "pay-3", `{"amount":500}`)
			results <- result{a, err}
		}()
	}
	var executed int
	var bodies []string
	for range callers {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, http.StatusCreated, r.Status, r.Body)
		if !r.Replayed {
			executed++
		}
		bodies = append(bodies, r.Body)
	}
	require.Equal(t, 1, executed, "answers without Idempotent-Replayed")
	for _, b := range bodies {
		require.JSONEq(t, bodies[0], b)
	}
	require.EqualValues(t, 1, shop.Runs())
}

// errorAnswerReplays checks that a handler's error answer is recorded like
// any other: the one place where a framework's own error handling can slip
// past the middleware.
func errorAnswerReplays(t *testing.T, recipe Recipe) {
	srv, shop := Serve(t, recipe)
	first, err := Post(srv.Client(), srv.URL+"/payments", "pay-4", `{"amount":0}`)
	require.NoError(t, err)
	second, err := Post(srv.Client(), srv.URL+"/payments", "pay-4", `{"amount":0}`)
	require.NoError(t, err)

	require.Equal(t, http.StatusBadRequest, first.Status, first.Body)
	require.Contains(t, first.Body, ErrNoAmount.Error())
	require.Equal(t, http.StatusBadRequest, second.Status, second.Body)
	require.True(t, second.Replayed, "Idempotent-Replayed on the duplicate")
	require.Equal(t, first.Body, second.Body)
	require.EqualValues(t, 1, shop.Runs())
}
