package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// execute runs the handler once under the lease and stores its answer.
func (m *Middleware) execute(c *call, l *lease) verdict {
	ctx, r := m.startRun(c, l)
	defer r.finish()
	r.exec.onError = m.cfg.errorHandler
	rw := newRecorder(c.w, m.cfg.maxResponse, m.cfg.storable)
	if m.cfg.expiryHeader != "" {
		exec := r.exec // not r itself: a closure over r would move it to the heap
		rw.stamp = func(status int, h http.Header) {
			if d := m.cfg.decide(c.r, exec, status); !d.Release {
				m.cfg.stampExpiry(h, d.TTL)
			}
		}
	}
	c.next.ServeHTTP(rw, c.r.WithContext(ctx))
	r.ran = true
	rec := rw.finish()
	r.exec.settle()
	v := m.storeAnswer(c, l, rec, m.cfg.decide(c.r, r.exec, rw.status))
	r.stored = true
	return v
}

// A run is one execution of a handler (execute) or a function (Do) under
// its lease: the context it runs with, and what becomes of the key when
// something panics.
type run struct {
	m           *Middleware
	c           *call
	l           *lease
	exec        *execution
	cancel      context.CancelFunc
	lost        context.CancelCauseFunc
	ran, stored bool // set by the caller as the run gets there
}

// startRun gives the context of a run. Once the key is claimed the run
// must finish: a client that gives up (a double-clicking browser aborts its
// first POST) retries and must find this execution's result, not a
// half-done one. The context ends when the lease is lost, since another
// instance may own the key by then, or after the execution timeout. Defer
// finish.
func (m *Middleware) startRun(c *call, l *lease) (context.Context, run) {
	r := run{m: m, c: c, l: l, exec: &execution{key: l.k.record, fp: c.fp, fence: l.fence}}
	ctx, lost := context.WithCancelCause(context.WithoutCancel(c.ctx))
	r.lost = lost
	l.wd.notify(func() { lost(ErrLockLost) })
	ctx, r.cancel = context.WithTimeout(withExecution(ctx, r.exec), m.cfg.execTimeout)
	return ctx, r
}

// finish ends a run's context and, when the run did not get its answer
// stored (a panic), settles the key: a run that never returned is
// released, so that a retry runs and the panic carries on to the server's
// recoverer; one that returned but panicked after (in a store policy, in a
// codec) must not run twice, so its key stays claimed and reads as
// interrupted once the lease, which ends here, runs out.
func (r *run) finish() {
	if !r.stored {
		if !r.ran {
			r.m.release(r.c.ctx, r.l.k, r.l.value(), 0)
		}
		r.l.end()
	}
	r.cancel()
	r.lost(nil)
}

// storeAnswer keeps the handler's answer for every duplicate (rec nil: executed,
// not replayable) and ends the lease.
func (m *Middleware) storeAnswer(c *call, l *lease, rec *record, d StoreDecision) verdict {
	defer l.end()
	if d.Release {
		m.release(c.ctx, l.k, l.value(), 0)
		return verdict{outcome: Executed, released: true}
	}
	expires := time.Now().Add(d.TTL) // before the store: never overstated
	var (
		how completion
		err error
	)
	for attempt, pause := 0, 10*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*2 {
		// Tried again briefly: the handler has run, and a lost store turns
		// every retry into an interrupted-execution answer.
		if attempt > 0 {
			time.Sleep(pause)
		}
		ctx, cancel := m.store.stepContext(c.ctx)
		how, err = m.store.complete(ctx, l.k, l.value(), c.fp, l.fence, rec, d.TTL)
		cancel()
		if err == nil || errors.Is(err, ErrLockLost) {
			break
		}
	}
	switch {
	case errors.Is(err, ErrLockLost):
		m.cfg.logger.Error("idempotency: lock lost: the handler ran, but its lease ended and another "+
			"execution owns the key now; this answer was not stored", "key", l.k.record)
		return verdict{outcome: Executed, err: err}
	case err != nil:
		m.cfg.logger.Error("idempotency: handler ran but its answer was not stored; retries will find it interrupted",
			"key", l.k.record, "error", err)
		return verdict{outcome: Executed, err: err}
	case how == rewritten:
		m.cfg.logger.Warn("idempotency: the key's record vanished while its handler ran (record TTL, eviction "+
			"or a flush); the answer was stored again", "key", l.k.record)
	}
	if rec != nil {
		rec.expires = expires
		m.cache.put(c.id, c.fp, rec, m.cacheExpiry(rec))
	}
	return verdict{outcome: Executed, rec: rec, storedFor: d.TTL}
}

// release gives a claimed key up, so that a retry runs: the record goes, an
// issued token returns to its scope, and the lock is freed. It tries again
// for up to retryFor, for a claim whose reply never came: one left behind
// reads as an interrupted execution for the whole record TTL, although its
// handler never ran.
func (m *Middleware) release(ctx context.Context, k keys, value string, retryFor time.Duration) {
	deadline := time.Now().Add(retryFor)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		step, cancel := m.store.stepContext(ctx)
		err := m.store.release(step, k, value)
		cancel()
		if err == nil {
			return
		}
		if time.Now().Add(pause).After(deadline) {
			m.cfg.logger.Warn("idempotency: could not release a claim; retries find it interrupted once its lease ends",
				"key", k.record, "error", err)
			return
		}
		time.Sleep(pause)
	}
}

// runUnprotected runs the handler without protection: a method or a
// request without a key that the configuration lets through, or any request
// under WithFailOpen while Redis is down (err).
func (m *Middleware) runUnprotected(c *call, err error) verdict {
	if c.run != nil { // a function call (Do), run without a lease
		c.run(c, nil)
		return verdict{outcome: Unprotected, err: err}
	}
	c.next.ServeHTTP(c.w, c.r)
	return verdict{outcome: Unprotected, err: err}
}
