package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bsm/redislock"
)

// watchdog renews a lease's lock every third of the lease. It lives exactly
// as long as the lease: stop ends it and waits for a renewal under way. A
// timer rather than a goroutine: most leases end before their first
// renewal, and then a watchdog costs one timer.
type watchdog struct {
	lock         *redislock.Lock
	lease        time.Duration
	renewTimeout time.Duration // bounds one renewal

	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	renewing sync.WaitGroup
	lost     bool
	onLost   func()
	// retaker takes a lapsed lock back while the key's record still names
	// the run (nil where another executor could take the key over).
	retaker retaker

	// expires is when the lock runs out unless renewed: a lease after the
	// start of the last attempt that renewed it (or obtained it), since
	// Redis may have started the TTL at any moment after that start.
	expires time.Time // written by one renewal at a time, under mu
}

func startWatchdog(lock *redislock.Lock, lease, stepTimeout time.Duration, obtainedSince time.Time, r retaker) *watchdog {
	wd := &watchdog{lock: lock, lease: lease, renewTimeout: min(stepTimeout, lease/3),
		expires: obtainedSince.Add(lease), retaker: r}
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
// expiry nears, and no attempt waits past that point.
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
	ctx, cancel := context.WithTimeout(context.Background(),
		max(min(wd.renewTimeout, time.Until(wd.expires)-margin), time.Millisecond))
	attempt := time.Now()
	err := wd.lock.Refresh(ctx, wd.lease, nil)
	cancel()
	next := wd.lease / 3
	switch {
	case err == nil:
		wd.mu.Lock()
		wd.expires = attempt.Add(wd.lease)
		wd.mu.Unlock()
	case errors.Is(err, redislock.ErrNotObtained):
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

// A retaker takes its lapsed lock back, with the same value, when the
// key's record still names its run and nobody holds the lock: a stalled
// Redis let the lock run out under a live run, whose answer is still the
// key's. Claims then wait for it again instead of reading it abandoned.
type retaker interface {
	retake(ctx context.Context) (bool, error)
}

// lapse handles a lock that ran out or is gone, and reports whether the
// watchdog goes on. Where another executor could take the key over, the
// lease is lost for good. Otherwise the lock is taken back if it can be,
// and tried again every third of a lease while the run lives.
func (wd *watchdog) lapse() bool {
	if wd.retaker == nil {
		wd.fail()
		return false
	}
	attempt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), wd.renewTimeout)
	ok, err := wd.retaker.retake(ctx)
	cancel()
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if err == nil && ok {
		wd.expires, wd.lost = attempt.Add(wd.lease), false
	} else {
		wd.lost = true
	}
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
