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
	lock        *redislock.Lock
	lease       time.Duration
	stepTimeout time.Duration

	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	renewing sync.WaitGroup
	lost     bool
	onLost   func()

	renewed time.Time // touched by one renewal at a time
}

func startWatchdog(lock *redislock.Lock, lease, stepTimeout time.Duration) *watchdog {
	wd := &watchdog{lock: lock, lease: lease, stepTimeout: stepTimeout, renewed: time.Now()}
	wd.mu.Lock() // renew reads the timer, and may run before AfterFunc returns
	wd.timer = time.AfterFunc(lease/3, wd.renew)
	wd.mu.Unlock()
	return wd
}

// renew refreshes the lock. When the lock turns out to be gone (another
// instance took the key over), or when no renewal has succeeded for a whole
// lease (Redis unreachable: the lease has lapsed and another instance may
// take the key), the lease is lost and renewing stops.
func (wd *watchdog) renew() {
	wd.mu.Lock()
	if wd.stopped {
		wd.mu.Unlock()
		return
	}
	wd.renewing.Add(1)
	wd.mu.Unlock()
	defer wd.renewing.Done()

	ctx, cancel := context.WithTimeout(context.Background(), min(wd.stepTimeout, wd.lease/3))
	attempt := time.Now()
	err := wd.lock.Refresh(ctx, wd.lease, nil)
	cancel()
	switch {
	case err == nil:
		wd.renewed = attempt
	case errors.Is(err, redislock.ErrNotObtained), time.Since(wd.renewed) >= wd.lease:
		wd.fail()
		return
	}
	// Any other error is transient: the next renewal tries again while the
	// lease still runs.
	wd.mu.Lock()
	if !wd.stopped {
		wd.timer.Reset(wd.lease / 3)
	}
	wd.mu.Unlock()
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
	wd.timer.Stop()
	wd.mu.Unlock()
	wd.renewing.Wait()
}
