package gin

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency/recipes/internal/recipetest"
	"github.com/stretchr/testify/require"
)

// TestPathParameters checks that wrapH hands gin's path parameters to a
// protected net/http handler, and that the route is protected all the same.
func TestPathParameters(t *testing.T) {
	var runs atomic.Int64
	transfer := func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		fmt.Fprintf(w, "transfer from account %s", r.PathValue("id"))
	}
	srv, _ := recipetest.Serve(t, func(redisAddr string, shop *recipetest.Shop) http.Handler {
		return NewRouter(redisAddr, shop.ServeHTTP, shop.ServeHTTP, transfer)
	})

	first, err := recipetest.Post(srv.Client(), srv.URL+"/accounts/42/transfers", "transfer-1", `{"amount":5}`)
	require.NoError(t, err)
	second, err := recipetest.Post(srv.Client(), srv.URL+"/accounts/42/transfers", "transfer-1", `{"amount":5}`)
	require.NoError(t, err)

	require.Equal(t, "transfer from account 42", first.Body)
	require.False(t, first.Replayed)
	require.Equal(t, first.Body, second.Body)
	require.True(t, second.Replayed, "Idempotent-Replayed on the duplicate")
	require.EqualValues(t, 1, runs.Load())
}
