package idempotency

import (
	"net/http"
	"time"
)

// A StoreDecision says what becomes of a handler's answer.
type StoreDecision struct {
	// Release gives the key up instead of storing the answer: a retry with
	// the same key runs the handler again. Only for answers given before
	// any side effect.
	Release bool
	// TTL keeps the answer for replay this long instead of the record TTL
	// (WithRecordTTL), when positive and shorter; then a retry runs again.
	// It is never below the wait timeout (WithWaitTimeout) nor a second, so
	// that a duplicate that waited for the answer finds it.
	TTL time.Duration
}

// A StorePolicy decides, per answer, whether it is stored (and for how
// long) or released. It sees the request and the status the handler
// answered. StoreAll, Store2xxOnly and StoreNoTransient are ready-made.
type StorePolicy func(r *http.Request, status int) StoreDecision

// StoreAll stores every answer, errors included: the handler may have had
// side effects before it failed, and "never twice" comes first. Stripe's
// rule, and the default.
func StoreAll(*http.Request, int) StoreDecision { return StoreDecision{} }

// Store2xxOnly stores successful answers and releases every other, so a
// client may retry a failed request with the same key. Safe only for
// handlers that fail before any side effect.
func Store2xxOnly(_ *http.Request, status int) StoreDecision {
	return StoreDecision{Release: status < 200 || status > 299}
}

// StoreNoTransient releases the answers that say "try again": 408 Request
// Timeout, 425 Too Early, 429 Too Many Requests and every 5xx; it stores
// the rest, 4xx validation failures included.
func StoreNoTransient(_ *http.Request, status int) StoreDecision {
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly,
		status == http.StatusTooManyRequests, status >= 500:
		return StoreDecision{Release: true}
	}
	return StoreDecision{}
}

// decide applies the store policy to the status the handler answered, once.
// A policy's lifetime is kept at least as long as a duplicate may wait
// (WithWaitTimeout, at least a second), so that a duplicate that waited for
// the answer finds it, and at most the record TTL.
func (c *config) decide(r *http.Request, e *execution, status int) StoreDecision {
	if e.state.Load() == execReleased {
		return StoreDecision{Release: true}
	}
	if e.decision != nil {
		return *e.decision
	}
	d := StoreDecision{TTL: c.recordTTL}
	if c.storePolicy != nil && status >= 100 { // 0: the handler hijacked the connection
		d = c.storePolicy(r, status)
		if d.TTL <= 0 {
			d.TTL = c.recordTTL
		}
		d.TTL = min(max(d.TTL, c.wait, time.Second), c.recordTTL)
	}
	e.decision = &d
	return d
}
