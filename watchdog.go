package idempotency

import (
	"context"
	"sync"
	"time"
)

// watchdog renews a lease's lock every third of the lease. It lives exactly
// as long as the lease: stop ends it and waits for a renewal under way. A
// timer rather than a goroutine: most leases end before their first
// renewal, and then a watchdog costs one timer.
type watchdog struct {
	lock         renewer
	lease        time.Duration
	renewTimeout time.Duration // bounds one renewal

	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	renewing sync.WaitGroup
	lost     bool
	onLost   func()
	// retakes: a lapsed lock is taken back while the key's record still
	// names the run (false where another executor could take the key over).
	retakes bool

	// expires is when the lock runs out unless renewed: a lease after the
	// start of the last attempt that renewed it (or obtained it), since
	// Redis may have started the TTL at any moment after that start.
	expires time.Time // written by one renewal at a time, under mu
}

// A renewer renews a lease's lock (renew.lua): it reports whether the lock
// is ours for a lease from the call. With retake, a lapsed lock is taken
// back when nobody holds it and the key's record still names the run: a
// stalled Redis let the lock run out under a live run, whose answer is
// still the key's, and claims then wait for it again instead of reading it
// abandoned.
type renewer interface {
	renew(ctx context.Context, retake bool) (bool, error)
}

func startWatchdog(lock renewer, lease, stepTimeout time.Duration, obtainedSince time.Time, retakes bool) *watchdog {
	wd := &watchdog{lock: lock, lease: lease, renewTimeout: min(stepTimeout, lease/3),
		expires: obtainedSince.Add(lease), retakes: retakes}
	// Renewals come every third of a lease, the first once two thirds of
	// it are left: at once when the obtain's reply was slow, so that a lock
	// started on late never runs out before its first renewal.
	first := max(min(lease/3, time.Until(wd.expires)-2*lease/3), 0)
	if costing && cost.noWatchdog {
		return wd // no timer: never renews
	}
	wd.mu.Lock() // renew reads the timer, and may run before AfterFunc returns
	wd.timer = time.AfterFunc(first, wd.renew)
	wd.mu.Unlock()
	return wd
}

// renew refreshes the lock. The lease is lost when the lock turns out to be
// gone (another instance took the key over), or when the lock is about to
// expire without a renewal (Redis unreachable or slow), a tenth of a lease
// before it does: the handler must know before another instance may take
// the key. Until then a failed renewal is tried again, sooner as the
// expiry nears, and no attempt waits past that point. Where nobody else
// may take the key over, a lost lease is no end: the renewals go on every
// third of a lease, and one that takes the lock back wins it again.
func (wd *watchdog) renew() {
	wd.mu.Lock()
	if wd.stopped {
		wd.mu.Unlock()
		return
	}
	wd.renewing.Add(1)
	wd.mu.Unlock()
	defer wd.renewing.Done()

	margin := wd.lease / 10
	// No renewal waits past the point where the run must know its lease is
	// lost; only a retake, of a lock that ran out already where nobody else
	// may take the key over, gets the whole renewal timeout.
	timeout := min(wd.renewTimeout, time.Until(wd.expires)-margin)
	if wd.retakes && wd.lapsed() {
		timeout = wd.renewTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Millisecond))
	attempt := time.Now()
	ours, err := wd.lock.renew(ctx, wd.retakes)
	cancel()
	next := wd.lease / 3
	switch {
	case err == nil && ours:
		wd.mu.Lock()
		wd.expires, wd.lost = attempt.Add(wd.lease), false
		wd.mu.Unlock()
	case err == nil:
		if !wd.lapse() {
			return
		}
	default:
		// A transient error: try again while the lock may still be ours.
		left := time.Until(wd.expires) - margin
		if left <= 0 {
			if !wd.lapse() {
				return
			}
			break
		}
		next = min(next, max(left/2, time.Millisecond))
	}
	wd.mu.Lock()
	if !wd.stopped {
		wd.timer.Reset(next)
	}
	wd.mu.Unlock()
}

// lapsed reports whether a renewal found the lock gone, or found it only
// when it had run out.
func (wd *watchdog) lapsed() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.lost
}

// lapse marks the lease lost, and reports whether the watchdog goes on:
// only where a lapsed lock may be taken back.
func (wd *watchdog) lapse() bool {
	if !wd.retakes {
		wd.fail()
		return false
	}
	wd.mu.Lock()
	wd.lost = true
	wd.mu.Unlock()
	return true
}

func (wd *watchdog) fail() {
	wd.mu.Lock()
	wd.lost = true
	f := wd.onLost
	wd.mu.Unlock()
	if f != nil {
		f()
	}
}

// isLost reports whether the lease was lost, or is as good as lost: no
// renewal has confirmed it, and the lock may expire within a tenth of a
// lease. That catches at once a lock whose obtain reply came back later
// than the whole lease, before the first renewal is even due.
func (wd *watchdog) isLost() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.lost || time.Until(wd.expires) < wd.lease/10
}

// notify calls f once the lease is lost, at once if it already is.
func (wd *watchdog) notify(f func()) {
	wd.mu.Lock()
	lost := wd.lost
	wd.onLost = f
	wd.mu.Unlock()
	if lost {
		f()
	}
}

func (wd *watchdog) stop() {
	wd.mu.Lock()
	wd.stopped = true
	if wd.timer != nil { // nil only in a benchmark build without renewals
		wd.timer.Stop()
	}
	wd.mu.Unlock()
	wd.renewing.Wait()
}
