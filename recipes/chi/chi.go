// Package chi mounts the idempotency middleware on a chi router. chi takes
// net/http middleware as it is, so there is nothing to adapt.
package chi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// NewRouter serves a token endpoint and two protected routes: POST /orders
// spends a token, POST /payments takes an Idempotency-Key. The Redis client
// lives as long as the process.
func NewRouter(redisAddr string, createOrder, createPayment http.HandlerFunc) *chi.Mux {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr,
		ContextTimeoutEnabled: true, // lets WithStoreTimeout cut a stalled Redis short
	})
	// Key-mode callers are told apart by their credentials (Authorization,
	// cookies, a TLS client certificate; name any other header they use).
	idem := idempotency.New(rdb, idempotency.WithCallerCredentials())

	r := chi.NewRouter()
	r.Get("/idempotency/token", idem.TokenHandler().ServeHTTP)
	r.With(idem.Protect).Post("/orders", createOrder)
	r.With(idem.ProtectKey).Post("/payments", createPayment)
	return r
}
