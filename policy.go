package idempotency

import (
	"context"
	"net/http"
	"sync/atomic"
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

// WithStorePolicy sets which answers are stored. It replaces
// WithReleaseOnServerError, and that replaces it: the last one given wins.
// Default StoreAll.
func WithStorePolicy(p StorePolicy) Option { return func(c *config) { c.storePolicy = p } }

// WithReleaseOnServerError releases the key when the handler answers 5xx, so
// a retry runs the handler again. Use it only for handlers that fail before
// any side effect. Default off: a 5xx is stored and replayed like any answer.
//
// Deprecated: use WithStorePolicy, with StoreNoTransient or a policy of your
// own; this option sets a policy that releases 5xx and stores the rest.
func WithReleaseOnServerError() Option {
	return WithStorePolicy(func(_ *http.Request, status int) StoreDecision {
		return StoreDecision{Release: status >= 500}
	})
}

// execution is what a protected handler's context carries: who it is
// (ExecutionOf), its fencing token, and what becomes of its answer.
type execution struct {
	key   string // Execution.Key
	fp    fingerprintSum
	fence uint64
	codec Codec // Do's, for a function
	// maxResponse is the middleware's WithMaxResponseBytes.
	maxResponse int
	// onError is the middleware's error handler, for a handler (WriteError).
	onError func(http.ResponseWriter, *http.Request, error)
	state   atomic.Int32 // running, released or decided
	// decision is the policy's answer, taken once, when the status went
	// out (for the expiry header) or when the handler returned.
	decision *StoreDecision
}

const (
	execRunning int32 = iota
	execReleased
	execDecided
)

var executionKey = &contextKey{"execution"}

// Release tells the middleware that the protected handler running on ctx
// did nothing that a retry must not repeat (a validation failure found
// before any side effect): its answer is sent but not stored, and the key
// is released, so the client may fix the request and retry with the same
// key. Call it before the handler writes: waiting duplicates replay nothing
// and run again. It reports whether it took effect: false outside a
// protected execution, and once the handler has returned.
func Release(ctx context.Context) bool {
	e, ok := ctx.Value(executionKey).(*execution)
	if !ok {
		return false
	}
	return e.state.CompareAndSwap(execRunning, execReleased) || e.state.Load() == execReleased
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

// released reports whether the work gave its key up with Release.
func (e *execution) released() bool { return e.state.Load() == execReleased }

// settle ends the handler's say in what becomes of its answer: a Release
// after it returned takes no effect.
func (e *execution) settle() {
	e.state.CompareAndSwap(execRunning, execDecided)
}
