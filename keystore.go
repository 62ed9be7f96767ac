package idempotency

import (
	"context"
	"time"
)

// keyStore is the port between a key's life (lifecycle.go) and the storage
// that keeps it: what each transition needs, one operation each, and
// nothing of how it is kept. Redis (store.go, one script per operation)
// and SQL (sqlstore.go, one transaction per operation) implement it.
//
// Every implementation keeps the same record, in the one layout of
// internal/keyspace, and the same lease beside it: an owner's lock value
// that lapses unless renewed. Each operation is atomic, and safe to repeat
// after a lost reply: a repeat answers the way the original did.
type keyStore interface {
	// claim takes the key's lease under lockValue and claims the key, or
	// says why not (claim.lua's rules).
	claim(ctx context.Context, k keys, lockValue, fingerprint string) (claim, error)
	// complete stores rec (nil: executed, not replayable) as the key's
	// answer for ttl and lets the lease go; ErrLockLost when another
	// executor owns the key now.
	complete(ctx context.Context, k keys, lockValue *string, fp string, fence uint64, rec *record, ttl time.Duration) (completion, error)
	// release undoes a claim: a retry runs again (a takeover is handed
	// back to the executor it was taken from).
	release(ctx context.Context, k keys, lockValue string) error
	// keep ends a run whose outcome cannot be known: the record stays
	// claimed, marked kept, and the lease goes.
	keep(ctx context.Context, k keys, lockValue string) error
	// renew extends the lease by a lease from now; with retake, a lapsed
	// one is taken back while the record still names the run.
	renew(ctx context.Context, k keys, lockValue string, retake bool) (bool, error)
	// unlock lets the lease go and leaves the record as it is.
	unlock(ctx context.Context, k keys, lockValue string) error
	// journal appends a step's entry to the run's journal (an empty entry
	// proves ownership only).
	journal(ctx context.Context, k keys, lockValue string, entry []byte, before int) (runProof, error)
	// watch tells a waiter when the key's holder lets go; nil (with a nil
	// error) where the store cannot, and then the waiter polls.
	watch(ctx context.Context, k keys, until time.Duration) (*watcher, error)
	// ping reports whether the store answers now, for Ready.
	ping(ctx context.Context) error
}

// stepContext bounds one store operation. It outlives the request's own
// context: an operation that started must finish even when the client has
// gone.
func (m *Middleware) stepContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), m.cfg.storeTimeout)
}
