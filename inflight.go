package idempotency

import (
	"sync"
	"sync/atomic"
	"time"
)

// flights coalesces concurrent requests for one key inside this process: the
// first (the leader) goes to Redis, and the rest wait in memory for its
// answer instead of polling Redis for the lock.
type flights struct {
	mu sync.Mutex
	m  map[identity]*flight
}

type flight struct {
	done   chan struct{} // made by the first follower: most flights have none
	fp     fingerprintSum
	rec    *record // the replayable answer, when the leader got one
	owner  *flights
	landed bool
	// changesAt is when the key's answer can next change, as the leader
	// last heard from Redis (Unix nanoseconds; 0 while it has heard
	// nothing): the claim horizon of an owner whose lock lapsed.
	changesAt atomic.Int64
}

// heard records that the leader found the key's answer cannot change for
// another d.
func (fl *flight) heard(d time.Duration) {
	fl.changesAt.Store(time.Now().Add(d).UnixNano())
}

// heard records that the key's answer cannot change for another d, for
// the call's own Retry-After and, when it leads a flight, its followers'.
func (c *call) heard(d time.Duration) {
	c.changesAt = time.Now().Add(d)
	if c.flight != nil {
		c.flight.heard(d)
	}
}

// retryIn is how long a follower whose wait ended should wait before it
// asks again: what its leader would be told, at least one lease. A
// follower that joined a moment after its leader may time out first, while
// the leader still asks Redis; it is told the same time as the leader, not
// a shorter one in which nothing can change.
func (fl *flight) retryIn(lease time.Duration) time.Duration {
	return max(lease, time.Until(time.Unix(0, fl.changesAt.Load())))
}

// wait returns a channel closed when the flight lands.
func (fl *flight) wait() <-chan struct{} {
	f := fl.owner
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.done == nil {
		fl.done = make(chan struct{})
		if fl.landed {
			close(fl.done)
		}
	}
	return fl.done
}

// join returns the flight for key, and whether the caller leads it.
func (f *flights) join(key identity, fp fingerprintSum) (*flight, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[key]; ok {
		return fl, false
	}
	if f.m == nil {
		f.m = make(map[identity]*flight)
	}
	fl := &flight{fp: fp, owner: f}
	f.m[key] = fl
	return fl, true
}

// land ends the leader's flight. rec is the stored answer that followers
// may replay, or nil when they must ask Redis themselves.
func (f *flights) land(key identity, fl *flight, rec *record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
	fl.rec = rec
	fl.landed = true
	if fl.done != nil {
		close(fl.done)
	}
}
