package idempotency

import "sync"

// flights coalesces concurrent requests for one key inside this process: the
// first (the leader) goes to Redis, and the rest wait in memory for its
// answer instead of polling Redis for the lock.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done        chan struct{}
	fingerprint string
	rec         *record // the replayable answer, when the leader got one
}

// join returns the flight for key, and whether the caller leads it.
func (f *flights) join(key, fingerprint string) (*flight, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[key]; ok {
		return fl, false
	}
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	fl := &flight{done: make(chan struct{}), fingerprint: fingerprint}
	f.m[key] = fl
	return fl, true
}

// land ends the leader's flight. rec is the stored answer that followers
// may replay, or nil when they must ask Redis themselves.
func (f *flights) land(key string, fl *flight, rec *record) {
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
	fl.rec = rec
	close(fl.done)
}
