// Package gin mounts the idempotency middleware on a gin router.
//
// The middleware is plain net/http, so the protected handlers are too: a gin
// handler writes to c.Writer, past the recorder the middleware hands on, and
// the middleware would store an empty 200 and replay that.
package gin

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// NewRouter serves a token endpoint and three protected routes: POST /orders
// spends a token, POST /payments and POST /accounts/:id/transfers take an
// Idempotency-Key. The Redis client lives as long as the process.
func NewRouter(redisAddr string, createOrder, createPayment, transfer http.HandlerFunc) *gin.Engine {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr,
		ContextTimeoutEnabled: true, // lets WithStoreTimeout cut a stalled Redis short
	})
	// Key-mode callers are told apart by their credentials (Authorization,
	// cookies, a TLS client certificate; name any other header they use).
	idem := idempotency.New(rdb, idempotency.WithCallerCredentials())

	r := gin.New()
	r.GET("/idempotency/token", gin.WrapH(idem.TokenHandler()))
	r.POST("/orders", gin.WrapH(idem.Protect(createOrder)))
	r.POST("/payments", gin.WrapH(idem.ProtectKey(createPayment)))
	r.POST("/accounts/:id/transfers", wrapH(idem.ProtectKey(transfer)))
	return r
}

// wrapH is gin.WrapH, plus gin's path parameters as r.PathValue(name).
func wrapH(h http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		for _, p := range c.Params {
			c.Request.SetPathValue(p.Key, p.Value)
		}
		h.ServeHTTP(c.Writer, c.Request)
	}
}
