package idempotency

import (
	"context"
	"encoding/hex"
	"net/http"
)

// An OutcomeStore keeps answers durably, committed in the same database
// transaction as the writes of the handler that gave them (package sqlidem
// is one, on database/sql). With WithOutcomeStore, an execution that was
// abandoned (its instance stopped after claiming the key and before storing
// an answer in Redis) is no longer answered 409 interrupted: the retry asks
// the store, and either replays the committed answer or, when nothing was
// committed, runs the handler again.
type OutcomeStore interface {
	// Recover is called by the request that has taken over key's
	// abandoned execution, holding key's lease under fencing token fence.
	// It returns the answer committed for key, if one was. When none was,
	// it must make sure before returning that no execution with a lower
	// fencing token can commit one any more (the abandoned executor may
	// only be paused), and return ok false: the handler then runs again
	// under fence.
	Recover(ctx context.Context, key string, fence uint64) (a Answer, ok bool, err error)
}

// An Answer is a handler's response as an OutcomeStore committed it.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	// Fingerprint is the Fingerprint of the execution that committed it.
	Fingerprint string
	// NotReplayable says that the execution committed, but its answer was
	// too large to keep (Execution.MaxResponseBytes): Status is what it
	// answered, Header and Body are empty, and duplicates are answered
	// ErrNotReplayable, as for an answer over the limit in Redis.
	NotReplayable bool
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

// WithOutcomeStore lets the middleware recover abandoned executions from s
// rather than answer 409 interrupted. Every handler behind the middleware
// must commit its writes and its answer through s (sqlidem's Handler does):
// recovery runs a handler again whenever s holds no answer for its key, so
// a handler that wrote elsewhere would write twice. Protect other routes
// with a Middleware of their own. It cannot be combined with WithFailOpen
// (New panics): a request run unprotected would commit no outcome. Default
// none: an abandoned execution is answered 409 interrupted (or run again,
// with WithRetryAbandoned).
func WithOutcomeStore(s OutcomeStore) Option { return func(c *config) { c.outcomes = s } }
