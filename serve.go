package idempotency

import (
	"context"
	"errors"
	"time"
)

// serve is one protected request's way through the middleware:
//
//	identify → cache → coalesce → claim → run → store → answer
//
// Each step returns a verdict: go on, replay a stored answer, answer a
// problem, or nothing left to write (the handler answered, or the client
// left). answer is the one place that writes the verdict and reports it.
func (m *Middleware) serve(c *call, extract KeyExtractor) {
	m.conclude(c, func() verdict { return m.decide(c, extract) })
}

// conclude runs a call's steps, writes the verdict they reach (for a
// request; a function call returns it) and reports it to the observer:
// once, also when the handler or the function panics (the panic goes on to
// the recoverer, or to Do's caller).
func (m *Middleware) conclude(c *call, steps func() verdict) verdict {
	done := false
	defer func() {
		if !done {
			m.observe(c, verdict{outcome: Executed, err: ErrHandlerPanicked})
		}
	}()
	v := steps()
	done = true
	if v.outcome == Executed && v.err == nil {
		v.err = c.failure // the handler's own failure, which it answered
	}
	if c.w != nil {
		m.write(c, v)
	}
	m.observe(c, v)
	return v
}

// decide runs the steps until one of them decides.
func (m *Middleware) decide(c *call, extract KeyExtractor) verdict {
	if !m.cfg.protects(c.r.Method) || m.nestedInSelf(c) {
		return m.runUnprotected(c, nil)
	}
	if err := m.identify(c, extract); err != nil {
		if errors.Is(err, ErrMissingKey) && m.cfg.optionalKey && !c.tokenMode {
			return m.runUnprotected(c, nil)
		}
		return refuse(err)
	}
	if m.nestedOnSameRecord(c) {
		return m.runUnprotected(c, nil)
	}
	return m.throughKey(c)
}

// throughKey takes an identified call through its key: an HTTP request,
// or a function call (Do). From here on both are the same protocol; only c.work, the handler
// or the function that the lease runs, differs.
func (m *Middleware) throughKey(c *call) verdict {
	for {
		if v := m.fromCache(c); v.decided() {
			return v
		}
		if costing && cost.noFlights {
			return m.lead(c, nil)
		}
		fl, leader := m.flights.join(c.id, c.fp)
		switch {
		case leader:
			return m.lead(c, fl)
		case fl.fp != c.fp:
			// Another request with this key leads here. Whether this one
			// is the key's request is for the key's record to say, not for
			// whoever leads: it goes to Redis by itself.
			return m.lead(c, nil)
		}
		if v := m.follow(c, fl); v.decided() {
			return v
		}
		// The leader had no answer to share (it was refused, or its handler
		// panicked): this request goes on by itself.
	}
}

// fromCache replays an answer that this process stored or replayed before.
func (m *Middleware) fromCache(c *call) verdict {
	e := m.cache.get(c.id, m.cache.now())
	if e == nil {
		return verdict{}
	}
	c.fromCache = true
	return m.replay(c, e.fp, e.rec)
}

// follow waits for the request of this process that leads the key's flight,
// and replays its answer.
func (m *Middleware) follow(c *call, fl *flight) verdict {
	timer := time.NewTimer(time.Until(c.deadline))
	defer timer.Stop()
	began := time.Now()
	select {
	case <-fl.wait():
	case <-timer.C:
		c.waited += time.Since(began)
		return refuse(m.inProgressAsHeard(c, fl))
	case <-c.ctx.Done():
		c.waited += time.Since(began)
		return m.callerDone(c, fl)
	}
	c.waited += time.Since(began)
	if fl.rec == nil {
		return verdict{}
	}
	return m.replay(c, fl.fp, fl.rec)
}

// callerDone answers a call whose own context ended while it waited. A
// client that left gets nothing (nothing ran for it), and a function's
// caller its context's error; a request whose deadline passed (an outer
// timeout) still gets an answer: the replay if it is here by now, else
// in-progress, never an empty 200, to be retried when the answer can
// change, as the call (or fl, the flight it followed) last heard.
func (m *Middleware) callerDone(c *call, fl *flight) verdict {
	if c.w == nil || !errors.Is(c.ctx.Err(), context.DeadlineExceeded) {
		return verdict{outcome: ClientGone}
	}
	if v := m.fromCache(c); v.decided() {
		return v
	}
	return refuse(m.inProgressAsHeard(c, fl))
}

// lead answers the call through Redis, and shares a stored answer with the
// calls that follow it in this process (fl), even when the work panics
// (then with nothing to share).
func (m *Middleware) lead(c *call, fl *flight) (v verdict) {
	if fl != nil {
		c.flight = fl
		defer func() { m.flights.land(c.id, fl, v.shared()) }()
	}
	// A call that may leave work for the background is admitted first:
	// while that work cannot be taken on, it is refused before it claims.
	if !(costing && cost.noAdmission) {
		if err := m.later.enter(c); err != nil {
			return m.storeUnavailable(c, err)
		}
		defer m.later.leave(c)
	}
	l, v := m.claim(c)
	if l == nil {
		return v
	}
	return l.execute(c)
}
