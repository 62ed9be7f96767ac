package idempotency

import (
	"context"
	"encoding/hex"
	"net/http"
	"sync/atomic"
	"time"
)

// Release tells the middleware that the protected handler running on ctx
// did nothing that a retry must not repeat (a validation failure found
// before any side effect): its answer is sent but not stored, and the key
// is released, so the client may fix the request and retry with the same
// key. Call it before the handler writes: waiting duplicates replay nothing
// and run again. It reports whether it took effect: false outside a
// protected execution, once the handler has returned, and in a run whose
// step (Step) began, whose key is kept instead (a resumable run's, for a
// retry to resume), since a release would let the retry repeat the step's
// effect: the run's answer is then not stored either, and a corrected
// request needs a new key.
func Release(ctx context.Context) bool {
	e, ok := ctx.Value(executionKey).(*execution)
	if !ok {
		return false
	}
	released := e.state.CompareAndSwap(execRunning, execReleased) || e.state.Load() == execReleased
	// Marked released all the same: the run's answer is not the key's,
	// and the release rule keeps a run whose steps took effect.
	return released && !e.tookEffect()
}

// Execution describes the protected execution a context belongs to: what
// an OutcomeStore records with the handler's writes.
type Execution struct {
	// Key names the key's record in Redis, as the middleware's log lines
	// do: the same for every request with the key, and an outcome store's
	// primary key. The key prefix (WithKeyPrefix) is part of it, so that
	// services that share Redis under their own prefixes can share an
	// outcome table too; changing the prefix leaves the committed rows
	// behind, as it leaves the Redis records.
	Key string
	// Fingerprint is the request's fingerprint in hex. A duplicate has the
	// same one; a request that reuses the key for another has not.
	Fingerprint string
	// Fence is the execution's fencing token (see FencingToken).
	Fence uint64
	// Codec encodes the result of a function run by Do (UseCodec); nil
	// for a handler.
	Codec Codec
	// MaxResponseBytes is the middleware's WithMaxResponseBytes: an answer
	// with a larger body is not kept for replay.
	MaxResponseBytes int
}

// ExecutionOf returns the protected execution that ctx belongs to, or ok
// false outside one (an unprotected request, or no middleware at all).
func ExecutionOf(ctx context.Context) (e Execution, ok bool) {
	x, ok := ctx.Value(executionKey).(*execution)
	if !ok {
		return Execution{}, false
	}
	return Execution{Key: x.key, Fingerprint: hex.EncodeToString(x.fp[:]), Fence: x.fence, Codec: x.codec,
		MaxResponseBytes: x.maxResponse}, true
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
	// owner is the Middleware that runs a handler, which a second layer of
	// the same Middleware recognises; rw is the handler's recorder, which
	// WriteReplay answers through. Both nil for a function.
	owner *Middleware
	rw    *recorder
	// lease is the run's lease, for StoreAnswerInTx.
	lease *lease
	state atomic.Int32 // running, released or decided
	// decision is the policy's answer, taken once, when the status went
	// out (for the expiry header) or when the handler returned.
	decision *StoreDecision
	// steps is the run's journal (journal.go): set at the start of a
	// resumable run, else made by its first Step.
	steps atomic.Pointer[journal]
	// attempts counts the attempts after the first (NextAttempt).
	attempts atomic.Int32
	// run is the run's context, which the middleware cancels when it cuts
	// the run off (cutOff): Step reads it whatever context it is given.
	run context.Context
	// failure is the first failure the work reported (ReportError), for
	// the observer: nil while it reported none.
	failure atomic.Pointer[error]
}

const (
	execRunning int32 = iota
	execReleased
	execDecided
)

var executionKey = &contextKey{"execution"}

// released reports whether the work gave its key up with Release.
func (e *execution) released() bool { return e.state.Load() == execReleased }

// closeRelease ends the handler's say in what becomes of its answer: a
// Release after it returned takes no effect.
func (e *execution) closeRelease() {
	e.state.CompareAndSwap(execRunning, execDecided)
}

// WriteReplay answers r with a, an answer the key already has (an
// OutcomeStore's committed one, found while the handler ran), exactly as
// the middleware replays a stored answer from Redis: the headers it
// stores (WithReplayHeaders), the replay hook, the Idempotent-Replayed
// marker, the expiry header, and the replaying request's negotiation. The
// answer kept for the key's next duplicates is a as it was committed. w
// and r are the handler's. Outside a protected handler it writes a with
// the marker and the default header rules.
func WriteReplay(w http.ResponseWriter, r *http.Request, a Answer) {
	x, ok := r.Context().Value(executionKey).(*execution)
	if !ok || x.owner == nil || x.rw == nil {
		x = &execution{owner: &Middleware{cfg: newConfig(nil)}}
		x.rw = newRecorder(w, len(a.Body), keepAll)
	}
	m := x.owner
	rec := m.recordOf(a)
	rec.expires = time.Now().Add(m.cfg.recordTTL)
	decode, err := rec.negotiate(r.Header)
	x.rw.adopt(r, rec, decode, &m.cfg, err)
}

// keepAll stores every header the recorder sees (the default rules
// are applied when the record is made).
func keepAll(string) bool { return true }
