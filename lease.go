package idempotency

import (
	"context"
	"time"

	"github.com/bsm/redislock"
)

// A lease is one request's hold on a key, with one life: it begins when the
// lock is obtained and ends when the lock is let go (by a claim that did
// not claim, the store of the answer or a release) or when the claim failed
// and the release goes on in the background. A
// watchdog renews the lock for exactly that long, so neither a slow claim,
// a replica wait nor a slow handler outlives it, while a crashed instance
// frees the key within one lease.
type lease struct {
	k    keys
	lock *redislock.Lock
	wd   *watchdog
	// step bounds the exchange that obtained the lock; the claim shares it,
	// so the store timeout bounds the two together.
	step    context.Context
	endStep context.CancelFunc
	fence   uint64 // the claim's fencing token, once claimed
}

// startLease starts the lease of a lock obtained by an attempt that began
// at began.
func (m *Middleware) startLease(k keys, lock *redislock.Lock, began time.Time, step context.Context, endStep context.CancelFunc) *lease {
	return &lease{k: k, lock: lock, step: step, endStep: endStep,
		wd: startWatchdog(lock, m.cfg.lease, m.cfg.storeTimeout, began)}
}

// value is the lock's random value, which the scripts check to know that
// the caller still owns the key.
func (l *lease) value() string { return l.lock.Token() }

// end stops renewing. Call it once the lock is let go, or known lost.
func (l *lease) end() {
	l.wd.stop()
	l.endStep()
}
