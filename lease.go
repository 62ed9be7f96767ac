package idempotency

import (
	"context"
	"net/http"
	"time"

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
	// began is when the attempt that obtained the lock started: the claim
	// shares that attempt's store timeout.
	began time.Time
	// ctx is detached from the client, and cancelled with ErrLockLost when
	// the watchdog finds the lock gone: work under the lease runs on it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wd     *watchdog
	fence  uint64 // the claim's fencing token, once claimed
}

func (m *Middleware) startLease(r *http.Request, k keys, lock *redislock.Lock, began time.Time) *lease {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	l := &lease{k: k, lock: lock, began: began, ctx: ctx, cancel: cancel}
	l.wd = startWatchdog(lock, m.cfg.lease, m.cfg.storeTimeout, func() { cancel(ErrLockLost) })
	return l
}

// value is the lock's random value, which the scripts check to know that
// the caller still owns the key.
func (l *lease) value() string { return l.lock.Token() }

// end stops renewing. Call it once the lock is let go, or known lost.
func (l *lease) end() {
	l.wd.stop()
	l.cancel(nil)
}
