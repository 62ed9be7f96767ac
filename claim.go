package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"time"
)

// claim takes the key's lease and claims the key in Redis. It returns the
// lease when the handler is to run under it; otherwise the verdict answers.
//
// A key whose lock lapsed while its executor may still store its answer
// (a stalled Redis let the lock run out under a live run) is waited for as
// if its lock were held: it is in progress, not interrupted.
func (m *Middleware) claim(c *call) (*lease, verdict) {
	k := m.redisKeys(c)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		l, v := m.claimOnce(c, k)
		var running stillRunning
		if l != nil || !errors.As(v.err, &running) {
			return l, v
		}
		c.heard(running.horizonIn)
		left := time.Until(c.deadline)
		if left <= 0 {
			return nil, refuse(m.inProgressAsHeard(c, nil))
		}
		began := time.Now()
		err := m.pause(c.ctx, nil, min(pause, left))
		c.waited += time.Since(began)
		if err != nil {
			return nil, m.callerDone(c, nil)
		}
	}
}

// storeUnavailable answers a call that Redis cannot take now: refused, or
// run unprotected with WithFailOpen.
func (m *Middleware) storeUnavailable(c *call, err error) verdict {
	if !m.cfg.failOpen {
		return refuse(err)
	}
	m.cfg.logger.Warn("idempotency: "+m.storeWord()+" unavailable, running the handler unprotected", "error", err)
	v := m.runUnprotected(c, err)
	v.outcome = Executed
	return v
}

// stillRunning: the key's lock lapsed, and its executor may still store
// for horizonIn; the claim waits. The answer changes then at the latest
// (interrupted, or taken over), and the owner most likely crashed, so that
// is when a client should ask again, not every lease.
type stillRunning struct{ horizonIn time.Duration }

func (stillRunning) Error() string { return "idempotency: the key's executor may still store" }

// claimOnce is one attempt of claim.
func (m *Middleware) claimOnce(c *call, k keys) (*lease, verdict) {
	l, cl, err := m.acquire(c, k)
	switch {
	case l != nil && err != nil:
		// The claim may have run without us hearing back, or run without
		// reaching enough replicas. Undo it. When the primary answers (too
		// few replicas) the undo goes first, so that the next request finds
		// the key free rather than held by a claim that never ran.
		// Otherwise it goes on in the background: when Redis cannot hear
		// the undo either, the lease runs out and a retry finds the claim
		// abandoned, the handler never run.
		switch {
		case errors.Is(err, errTooFewReplicas):
			l.release(c.ctx)
			return nil, refuse(unavailable(err)) // the claim stood on the primary: no running unprotected
		case neverSent(err):
			l.end() // nothing to undo
		default:
			l.releaseLater()
		}
		return nil, m.storeUnavailable(c, unavailable(err))
	case errors.Is(err, ErrStoreUnavailable):
		return nil, m.storeUnavailable(c, err)
	case errors.Is(err, errCallerDone):
		return nil, m.callerDone(c, nil)
	case err != nil:
		return nil, refuse(err)
	}
	switch cl.outcome {
	case outcomeClaimed:
		l.began = l.began.Add(cl.queued)
		l.watch()
		if l.wd.isLost() {
			// The lease ran out during the claim or the replica wait:
			// another instance may own the key by
			// now, so the handler must not start. Nothing ran; the claim is
			// undone if still ours.
			l.release(c.ctx)
			return nil, refuse(unavailable(ErrLockLost))
		}
		l.fence, c.fence = cl.fence, cl.fence
		if c.resume {
			if v := l.resumeFrom(cl.journal); v.decided() {
				return nil, v
			}
		}
		if cl.retaken && m.cfg.outcomes != nil {
			if runAgain, v := l.recoverAbandoned(c); !runAgain {
				return nil, v
			}
		}
		return l, verdict{}
	case outcomeDone:
		m.cache.put(c.id, c.fp, cl.rec, m.cacheExpiry(cl.rec))
		return nil, m.replay(c, c.fp, cl.rec) // the claim matched the fingerprint
	case outcomeUnknown:
		err = ErrTokenNotFound
	case outcomeExpired:
		err = ErrTokenExpired
	case outcomeMismatch:
		err = ErrKeyReused
	case outcomeBig:
		err = ErrNotReplayable
	case outcomeAbandoned:
		// Only a person can tell whether it took effect: name the key,
		// for idemctl.
		m.cfg.logger.Warn("idempotency: key interrupted: the instance that claimed it stopped before storing "+
			"an answer; inspect and settle it with idemctl", "key", k.record)
		err = ErrInterrupted
	case outcomeUnreadable:
		err = ErrUnreadableRecord
	default: // outcomeRunning (acquire waits out outcomeHeld)
		err = stillRunning{cl.horizonIn}
	}
	return nil, refuse(err)
}

// claimKey sends l's claim, within the store timeout; with
// WithReplicaAcks it then waits for replicas.
func (m *Middleware) claimKey(c *call, l *lease) (claim, error) {
	ctx, cancel := m.stepContext(c.ctx)
	defer cancel()
	if m.cfg.replicaAcks > 0 {
		return m.claimReplicated(ctx, c, l)
	}
	return m.keyStore.claim(ctx, l.k, l.lockValue, l.fpText)
}

// acquire claims the key, waiting while another executor holds its lock,
// until the deadline (ErrInProgress) or the client leaves (errCallerDone).
// It returns the lease whose claim claimed; or the claim that decided the
// request without the lock (a replay, a refusal, a run that may still
// store); or, with the lease its claim tried to take, the claim's failure.
//
// A waiter subscribes to the key's release and tries again when the holder
// publishes, or after a growing pause (50 ms up to 500 ms) in case a message
// is lost; without a subscription it falls back to the pauses alone.
func (m *Middleware) acquire(c *call, k keys) (*lease, claim, error) {
	var sub *watcher
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	pause, subscribed := 50*time.Millisecond, false
	var waitStart time.Time // set once the lock turns out to be held
	defer func() {
		if !waitStart.IsZero() {
			c.waited += time.Since(waitStart)
		}
	}()
	fp := c.fp.text() // once for every attempt and the lease's scripts
	for {
		began := time.Now()
		l := m.newLease(k, fp, began)
		cl, err := m.claimKey(c, l)
		switch {
		case err != nil:
			return l, claim{}, err
		case cl.outcome == outcomeClaimed:
			return l, cl, nil
		case cl.outcome != outcomeHeld:
			return nil, cl, nil
		}
		if waitStart.IsZero() {
			waitStart = began
		}
		left := time.Until(c.deadline)
		if left <= 0 {
			return nil, claim{}, m.inProgress()
		}
		if !subscribed {
			// Subscribe, then try once more at once: the holder may have
			// let go before the flag was up, and then nobody publishes.
			subscribed = true
			ctx, cancel := m.stepContext(c.ctx)
			sub, _ = m.keyStore.watch(ctx, k, left)
			cancel()
			continue
		}
		if err := m.pause(c.ctx, sub, min(pause, left)); err != nil {
			return nil, claim{}, err
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// newLockValue is a fresh lock value: 16 random bytes, base64url.
// crypto/rand never fails (it crashes the program rather than return
// short).
func newLockValue() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// pause waits for a release message on sub (or plain time without one), or
// for the caller's context to end: then it returns why.
func (m *Middleware) pause(ctx context.Context, sub *watcher, d time.Duration) error {
	if sub != nil {
		sub.released(ctx, d)
	} else {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
	}
	if ctx.Err() != nil {
		return errCallerDone
	}
	return nil
}

// errCallerDone: the caller's context ended while it waited for the lock.
var errCallerDone = errors.New("idempotency: the caller's context ended")

// cacheExpiry is when a cache entry of rec stops answering without Redis.
func (m *Middleware) cacheExpiry(rec *record) time.Time {
	if until := time.Now().Add(m.cfg.cacheTTL); until.Before(rec.expires) {
		return until
	}
	return rec.expires
}
