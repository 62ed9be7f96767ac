package idempotency

import (
	"context"
	"net/http"
)

// Ready reports whether the middleware can serve protected requests now:
// nil once the store answered (Redis a PING, a database a ping) within the
// store timeout, and otherwise an error that matches ErrStoreUnavailable.
// A load balancer's readiness probe that asks it takes an instance cut off
// from its store out of rotation,
// rather than leave it answering its share of requests 503. It writes
// nothing, so probes never add to what Redis keeps.
func (m *Middleware) Ready(ctx context.Context) error {
	ctx, cancel := m.stepContext(ctx)
	defer cancel()
	if err := m.keyStore.ping(ctx); err != nil {
		return unavailable(err)
	}
	return nil
}

// ReadyHandler answers a readiness probe: 200 "ready" while Ready says
// so, else 503 store-unavailable with Retry-After, through the error
// handler.
//
//	mux.Handle("GET /readyz", m.ReadyHandler())
func (m *Middleware) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := m.Ready(r.Context()); err != nil {
			m.cfg.errorHandler(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write([]byte("ready\n"))
	})
}
