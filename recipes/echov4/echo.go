// Package echov4 mounts the idempotency middleware on an echo v4 router.
//
// echo.WrapMiddleware hands the middleware's writer to the echo handler
// (c.Response() wraps it), so echo handlers work as they are, provided they
// write their error answers themselves: see answered.
package echov4

import (
	"github.com/labstack/echo/v4"
	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// NewRouter serves a token endpoint and two protected routes: POST /orders
// spends a token, POST /payments takes an Idempotency-Key. The Redis client
// lives as long as the process.
func NewRouter(redisAddr string, createOrder, createPayment echo.HandlerFunc) *echo.Echo {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr,
		ContextTimeoutEnabled: true, // lets WithStoreTimeout cut a stalled Redis short
	})
	// Key-mode callers are told apart by their credentials (Authorization,
	// cookies, a TLS client certificate; name any other header they use).
	idem := idempotency.New(rdb, idempotency.WithCallerCredentials())

	e := echo.New()
	e.GET("/idempotency/token", echo.WrapHandler(idem.TokenHandler()))
	e.POST("/orders", answered(createOrder), echo.WrapMiddleware(idem.Protect))
	e.POST("/payments", answered(createPayment), echo.WrapMiddleware(idem.ProtectKey))
	return e
}

// answered writes a returned error inside the protected handler, where the
// middleware records it. Left to echo, the error would be written after the
// middleware had stored an empty 200, and every duplicate would get that.
func answered(h echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := h(c); err != nil {
			c.Error(err)
		}
		return nil
	}
}
