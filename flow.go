package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// protect answers one identified request: from the response cache, behind
// a concurrent request for the same key in this process, or through Redis.
func (m *Middleware) protect(c *call) {
	for {
		if e := m.cache.get(c.id, time.Now()); e != nil {
			c.fromCache = true
			m.replay(c, e.fp, e.rec)
			return
		}
		fl, leader := m.flights.join(c.id, c.fp)
		if leader {
			m.leadFlight(c, fl)
			return
		}
		if !m.await(c, fl) {
			return
		}
	}
}

// leadFlight answers c for every request waiting in fl, and lands fl even
// when the handler panics.
func (m *Middleware) leadFlight(c *call, fl *flight) {
	var shared *record
	defer func() { m.flights.land(c.id, fl, shared) }()
	shared = m.lead(c)
}

// replay answers with a stored response, unless it belongs to a different
// request.
func (m *Middleware) replay(c *call, fp fingerprintSum, rec *record) {
	if fp != c.fp {
		m.reject(c, ErrKeyReused)
		return
	}
	c.noteReplay()
	rec.write(c.w)
}

// await waits for another request's flight. It answers the request and
// returns false, or returns true when the request must go on by itself.
func (m *Middleware) await(c *call, fl *flight) bool {
	timer := time.NewTimer(time.Until(c.deadline))
	defer timer.Stop()
	began := time.Now()
	select {
	case <-fl.wait():
		c.waited += time.Since(began)
	case <-timer.C:
		c.waited += time.Since(began)
		m.reject(c, ErrInProgress)
		return false
	case <-c.r.Context().Done():
		c.outcome = ClientGone
		return false // nobody is listening, and nothing ran for this request
	}
	if fl.rec == nil {
		return true
	}
	m.replay(c, fl.fp, fl.rec)
	return false
}

// lead takes the lock, claims the key and acts on the claim. It returns the
// stored answer when there is one for waiting requests to replay.
func (m *Middleware) lead(c *call) *record {
	k := m.redisKeys(c)
	lock, ctx, cancel, err := m.acquire(c, k)
	switch {
	case errors.Is(err, context.Canceled):
		c.outcome = ClientGone
		return nil
	case errors.Is(err, ErrStoreUnavailable) && m.cfg.failOpen:
		m.cfg.logger.Warn("idempotency: Redis unavailable, running the handler unprotected", "error", err)
		c.next.ServeHTTP(c.w, c.r)
		c.outcome, c.err = Executed, err
		return nil
	case err != nil:
		m.reject(c, err)
		return nil
	}
	var cl claim
	if m.cfg.replicaAcks > 0 {
		cl, err = m.claimReplicated(ctx, c, k, lock.Token())
	} else {
		cl, err = m.store.claim(ctx, k, lock.Token(), string(c.fp[:]))
	}
	cancel()
	if err != nil {
		// The claim may have run without us hearing back, or run without
		// reaching enough replicas. Undo it, after answering: the client's
		// 503 must not wait for a Redis that just failed us. When Redis
		// cannot hear the undo either, the lease runs out and a retry finds
		// the claim abandoned, the handler never run.
		m.reject(c, unavailable(err))
		go m.undoClaim(c.r, k, lock.Token())
		return nil
	}
	switch cl.outcome {
	case outcomeClaimed:
		return m.execute(c, k, lock, cl.fence)
	case outcomeDone:
		m.cache.put(c.id, c.fp, cl.rec, time.Now().Add(cl.ttl))
		m.replay(c, c.fp, cl.rec) // the claim already matched the fingerprint
		return cl.rec
	case outcomeUnknown:
		err = ErrTokenNotFound
	case outcomeMismatch:
		err = ErrKeyReused
	case outcomeBig:
		err = ErrNotReplayable
	case outcomeAbandoned:
		err = ErrInterrupted
	default: // outcomeLost: Redis was slower than the whole lease
		err = unavailable(errors.New("lock lease ran out before the claim"))
	}
	m.reject(c, err)
	return nil
}

// acquire takes the key's lock, waiting while another instance holds it,
// until the deadline (ErrInProgress) or the client leaves (context.Canceled).
// With the lock it returns the step context that took it, for the claim:
// the store timeout bounds the two together.
//
// A waiter subscribes to the key's release and tries again when the holder
// publishes, or after a growing pause (50 ms up to 500 ms) in case a message
// is lost; without a subscription it falls back to the pauses alone.
func (m *Middleware) acquire(c *call, k keys) (*redislock.Lock, context.Context, context.CancelFunc, error) {
	var sub *redis.PubSub
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	pause, subscribed := 50*time.Millisecond, false
	var waitStart time.Time // set once the lock turns out to be held
	defer func() {
		if !waitStart.IsZero() {
			c.waited += time.Since(waitStart)
		}
	}()
	for {
		ctx, cancel := m.store.stepContext(c.r.Context())
		lock, err := m.store.obtain(ctx, k)
		if err == nil {
			return lock, ctx, cancel, nil
		}
		cancel()
		if !errors.Is(err, redislock.ErrNotObtained) {
			return nil, nil, nil, unavailable(err)
		}
		if waitStart.IsZero() {
			waitStart = time.Now()
		}
		left := time.Until(c.deadline)
		if left <= 0 {
			return nil, nil, nil, ErrInProgress
		}
		if !subscribed {
			// Subscribe, then try the lock once more at once: the holder may
			// have let go before the flag was up, and then nobody publishes.
			subscribed = true
			ctx, cancel := m.store.stepContext(c.r.Context())
			sub, _ = m.store.watch(ctx, k, left)
			cancel()
			continue
		}
		if err := m.pause(c.r.Context(), sub, min(pause, left)); err != nil {
			return nil, nil, nil, err
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// pause waits for a release message on sub (or plain time without one), or
// for the client to leave.
func (m *Middleware) pause(ctx context.Context, sub *redis.PubSub, d time.Duration) error {
	if sub != nil {
		released(ctx, sub, d)
	} else {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
	}
	if ctx.Err() != nil {
		return context.Canceled
	}
	return nil
}

// execute runs the handler once under the claimed key and stores its answer.
func (m *Middleware) execute(c *call, k keys, lock *redislock.Lock, fence uint64) *record {
	// Once the key is claimed the handler must finish: a client that gives
	// up (a double-clicking browser aborts its first POST) retries and must
	// find this execution's result, not a half-done one.
	ctx, cancelTimeout := context.WithTimeout(withFence(context.WithoutCancel(c.r.Context()), fence), m.cfg.execTimeout)
	defer cancelTimeout()
	ctx, cancelLost := context.WithCancelCause(ctx)
	defer cancelLost(nil)
	wd := startWatchdog(lock, m.cfg.lease, m.cfg.storeTimeout, func() { cancelLost(ErrLockLost) })

	rw := newRecorder(c.w, &m.cfg)
	returned := false
	defer func() {
		if !returned {
			// The handler panicked. Nothing is stored as its answer; the key
			// is released so that a retry runs, and the panic carries on to
			// the server's recoverer.
			wd.stop()
			m.releaseQuietly(c.r, k, lock.Token())
		}
	}()
	c.fence = fence
	c.next.ServeHTTP(rw, c.r.WithContext(ctx))
	returned = true
	c.outcome = Executed
	defer wd.stop()

	rec := rw.result()
	if rec != nil && rec.status >= 500 && m.cfg.releaseOn5xx {
		m.releaseQuietly(c.r, k, lock.Token())
		return nil
	}
	if err := m.complete(c.r, k, lock.Token(), rec); err != nil {
		m.cfg.logger.Error("idempotency: handler ran but its response was not stored",
			"key", k.record, "error", err)
		c.err = err
		return nil
	}
	if rec != nil {
		m.cache.put(c.id, c.fp, rec, time.Now().Add(m.cfg.recordTTL))
	}
	return rec
}

// complete stores the answer, trying again briefly: the handler has run, and
// a lost store turns every retry into an interrupted-execution answer.
func (m *Middleware) complete(r *http.Request, k keys, lockValue string, rec *record) error {
	var err error
	for attempt, pause := 0, 10*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*2 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		ctx, cancel := m.store.stepContext(r.Context())
		err = m.store.complete(ctx, k, lockValue, rec)
		cancel()
		if err == nil || errors.Is(err, ErrLockLost) {
			return err
		}
	}
	return err
}

// undoClaim releases a claim whose reply never came, trying again for as
// long as the lease runs: a claim left behind reads as an interrupted
// execution for the whole record TTL, although its handler never ran.
func (m *Middleware) undoClaim(r *http.Request, k keys, lockValue string) {
	deadline := time.Now().Add(m.cfg.lease)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		ctx, cancel := m.store.stepContext(r.Context())
		err := m.store.release(ctx, k, lockValue)
		cancel()
		if err == nil {
			return
		}
		if time.Now().Add(pause).After(deadline) {
			m.cfg.logger.Warn("idempotency: could not undo an unconfirmed claim; retries will find it interrupted",
				"key", k.record, "error", err)
			return
		}
		time.Sleep(pause)
	}
}

func (m *Middleware) releaseQuietly(r *http.Request, k keys, lockValue string) {
	ctx, cancel := m.store.stepContext(r.Context())
	defer cancel()
	if err := m.store.release(ctx, k, lockValue); err != nil {
		m.cfg.logger.Warn("idempotency: could not release a claim; it ends with its lease",
			"key", k.record, "error", err)
	}
}
