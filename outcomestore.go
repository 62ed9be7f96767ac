package idempotency

import (
	"context"
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
