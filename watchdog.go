package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/bsm/redislock"
)

// watchdog renews a lease's lock. It lives exactly as long as the lease:
// stop ends it and waits for it.
type watchdog struct {
	quit chan struct{}
	done chan struct{}
}

// startWatchdog renews lock every third of the lease. When the lock turns
// out to be gone (another instance took the key over), or when no renewal
// has succeeded for a whole lease (Redis unreachable: the lease has lapsed
// and another instance may take the key), it calls lost once and stops.
func startWatchdog(lock *redislock.Lock, lease, stepTimeout time.Duration, lost func()) *watchdog {
	wd := &watchdog{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(wd.done)
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		renewed := time.Now()
		for {
			select {
			case <-wd.quit:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), min(stepTimeout, lease/3))
			attempt := time.Now()
			err := lock.Refresh(ctx, lease, nil)
			cancel()
			switch {
			case err == nil:
				renewed = attempt
			case errors.Is(err, redislock.ErrNotObtained), time.Since(renewed) >= lease:
				lost()
				return
			}
			// Any other error is transient: the next tick tries again while
			// the lease still runs.
		}
	}()
	return wd
}

func (wd *watchdog) stop() {
	close(wd.quit)
	<-wd.done
}
