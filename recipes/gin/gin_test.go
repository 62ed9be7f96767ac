package gin

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/recipes/internal/recipetest"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode) // no route listing on stdout
	redistest.Main(m)
}

func TestNewRouter(t *testing.T) {
	recipetest.Run(t, func(redisAddr string, shop *recipetest.Shop) http.Handler {
		return NewRouter(redisAddr, shop.ServeHTTP, shop.ServeHTTP, shop.ServeHTTP)
	})
}
