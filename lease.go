package idempotency

import (
	"context"

	"github.com/bsm/redislock"
)

// A lease is one request's hold on a key, with one life: it begins when the
// lock is obtained and ends when the script that lets the lock go has run
// (a claim that did not claim, the store of the answer, a release). A
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

func (m *Middleware) startLease(k keys, lock *redislock.Lock, step context.Context, endStep context.CancelFunc) *lease {
	return &lease{k: k, lock: lock, step: step, endStep: endStep,
		wd: startWatchdog(lock, m.cfg.lease, m.cfg.storeTimeout)}
}

// value is the lock's random value, which the scripts check to know that
// the caller still owns the key.
func (l *lease) value() string { return l.lock.Token() }

// end stops renewing. Call it once the lock is let go, or known lost.
func (l *lease) end() {
	l.wd.stop()
	l.endStep()
}
