package echov4

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/recipes/internal/recipetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestNewRouter(t *testing.T) {
	recipetest.Run(t, func(redisAddr string, shop *recipetest.Shop) http.Handler {
		return NewRouter(redisAddr, place(shop), place(shop))
	})
}

// place is an echo handler as one is usually written: it binds the body,
// answers with c.JSON and returns its errors.
func place(shop *recipetest.Shop) echo.HandlerFunc {
	return func(c echo.Context) error {
		var o recipetest.Order
		if err := c.Bind(&o); err != nil {
			return err
		}
		receipt, err := shop.Place(o)
		if err != nil {
			return echo.NewHTTPError(http.StatusBadRequest, err.Error())
		}
		return c.JSON(http.StatusCreated, receipt)
	}
}
