package chi

import (
	"net/http"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/recipes/internal/recipetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestNewRouter(t *testing.T) {
	recipetest.Run(t, func(redisAddr string, shop *recipetest.Shop) http.Handler {
		return NewRouter(redisAddr, shop.ServeHTTP, shop.ServeHTTP)
	})
}
