package idempotency

// An Outcome is what the middleware did with one protected request.
type Outcome int

const (
	// Executed: the handler ran. Event.Err is set when its answer could
	// not be stored, when it ran unprotected under WithFailOpen, when it
	// panicked (ErrHandlerPanicked), or when it reported a failure of its
	// own (ReportError; WriteError reports what it answers, as an outcome
	// store's refusals do).
	Executed Outcome = iota + 1
	// Replayed: a stored answer was replayed, from Redis or from this
	// process's memory (Event.FromCache).
	Replayed
	// Waited: the request waited for another with the same key and then
	// replayed its answer.
	Waited
	// Conflict: answered 409 (still in progress past the wait bound, not
	// replayable, or interrupted).
	Conflict
	// Rejected: answered 4xx before anything ran (no key, malformed key,
	// unknown token, reused key, body too large, no scope).
	Rejected
	// StoreError: Redis failed or was too slow; answered 503 and nothing
	// ran.
	StoreError
	// ClientGone: the client left while the request waited; nothing ran and
	// nothing was answered.
	ClientGone
	// Unprotected: the handler ran without protection, as configured: a
	// method named by WithUnprotectedMethods (GET, HEAD, OPTIONS and TRACE
	// by default), or a key-mode request without a key under
	// WithOptionalKey.
	Unprotected
)

var outcomeNames = [...]string{"", "executed", "replayed", "waited", "conflict", "rejected", "store_error", "client_gone", "unprotected"}

func (o Outcome) String() string {
	if o > 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}
