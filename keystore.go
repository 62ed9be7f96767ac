package idempotency

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// keyStore is the port between a key's life (lifecycle.go) and the storage
// that keeps it: what each transition needs, one operation each, and
// nothing of how it is kept. Redis (redisstore.go, one script per operation)
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

// claimFound is what a claim found, in claim.lua's words, as either store
// reports it: its word, and what comes with it.
type claimFound struct {
	word      string
	fence     string
	retaken   bool
	journal   string // retaken: the journal of the run taken over
	record    string // done: the record
	ttl       int64  // done: the record's milliseconds left
	horizonIn int64  // running: milliseconds until the horizon
}

// read is the claim f reports, for the key k.
func (f claimFound) read(cfg *config, k keys) (claim, error) {
	switch f.word {
	case "claimed":
		fence, err := strconv.ParseUint(f.fence, 10, 64)
		if err != nil || fence == 0 {
			return claim{}, fmt.Errorf("idempotency: bad fencing token %q", f.fence)
		}
		cl := claim{outcome: outcomeClaimed, fence: fence, retaken: f.retaken}
		if f.retaken {
			j := f.journal // empty when the runs taken over journaled nothing
			cl.journal = &j
		}
		return cl, nil
	case "done":
		rec, err := decodeRecord(f.record)
		if err != nil {
			return unreadableClaim(cfg, k, err), nil
		}
		rec.expires = time.Now().Add(time.Duration(f.ttl) * time.Millisecond)
		return claim{outcome: outcomeDone, rec: rec}, nil
	case "corrupt":
		return unreadableClaim(cfg, k, errCorruptRecord), nil
	case "running":
		return claim{outcome: outcomeRunning, horizonIn: time.Duration(max(f.horizonIn, 0)) * time.Millisecond}, nil
	}
	if outcome, ok := wordOutcomes[f.word]; ok {
		return claim{outcome: outcome}, nil
	}
	return claim{}, fmt.Errorf("idempotency: unexpected claim reply %q", f.word)
}

// wordOutcomes are the claim's replies that carry nothing but their word.
var wordOutcomes = map[string]claimOutcome{"unknown": outcomeUnknown, "expired": outcomeExpired,
	"mismatch": outcomeMismatch, "big": outcomeBig, "abandoned": outcomeAbandoned, "held": outcomeHeld}
