package idempotency

import (
	"context"
	"net/http"
)

// handlerRun is HTTP's adapter over a key's lifecycle (lifecycle.go): it
// runs the protected handler with a recorder in front of the client, so
// that what the handler answers goes out as usual and is kept for replay.
type handlerRun struct {
	m    *Middleware
	c    *call
	next http.Handler
	rw   *recorder
}

func (h *handlerRun) run(ctx context.Context, x *execution) *record {
	m, c := h.m, h.c
	x.onError = m.cfg.errorHandler
	h.rw = newRecorder(c.w, m.cfg.maxResponse, m.cfg.storable)
	h.rw.head = c.r.Method == http.MethodHead
	h.rw.request = c.r.Header
	x.owner, x.rw = m, h.rw
	if m.cfg.expiryHeader != "" {
		h.rw.stamp = func(status int, hdr http.Header) {
			if d := m.cfg.decide(c.r, x, status); !d.Release {
				m.cfg.stampExpiry(hdr, d.TTL)
			}
		}
	}
	defer func() { c.failure = x.reported() }() // a panic's report too
	h.next.ServeHTTP(h.rw, c.r.WithContext(ctx))
	return h.rw.finish()
}

func (h *handlerRun) decide(x *execution) StoreDecision {
	return h.m.cfg.decide(h.c.r, x, h.rw.status)
}

// committed: once the status is out, the client has part of an answer, and
// what the handler did before it cannot be undone by running it again.
func (h *handlerRun) committed() bool { return h.rw != nil && h.rw.wroteHeader }

// succeeded: the handler answered 2xx itself. A silent return, which
// net/http sends as an empty 200, says nothing.
func (h *handlerRun) succeeded() bool {
	return !h.rw.silent && h.rw.status >= 200 && h.rw.status <= 299
}

func (h *handlerRun) unprotected() { h.next.ServeHTTP(h.c.w, h.c.r) }

// runUnprotected runs the work without protection: a method or a request
// without a key that the configuration lets through, or any request under
// WithFailOpen while Redis is down (err).
func (m *Middleware) runUnprotected(c *call, err error) verdict {
	c.work.unprotected()
	return verdict{outcome: Unprotected, err: err}
}
