package idempotency

import (
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
	answered := false
	defer func() {
		if !answered { // the handler panicked; the panic goes on to the recoverer
			m.observe(c, verdict{outcome: Executed, err: ErrHandlerPanicked})
		}
	}()
	v := m.decide(c, extract)
	answered = true
	m.answer(c, v)
}

// decide runs the steps until one of them decides.
func (m *Middleware) decide(c *call, extract KeyExtractor) verdict {
	if !m.cfg.protects(c.r.Method) {
		return m.runUnprotected(c, nil)
	}
	if err := m.identify(c, extract); err != nil {
		if errors.Is(err, ErrMissingKey) && m.cfg.optionalKey && !c.tokenMode {
			return m.runUnprotected(c, nil)
		}
		return refuse(err)
	}
	return m.settle(c)
}

// settle decides an identified call: an HTTP request, or a function call
// (Do). From here on both are the same protocol; only c.run, which runs
// the handler or the function under the lease, differs.
func (m *Middleware) settle(c *call) verdict {
	for {
		if v := m.fromCache(c); v.decided() {
			return v
		}
		fl, leader := m.flights.join(c.id, c.fp)
		if leader {
			return m.lead(c, fl)
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
	e := m.cache.get(c.id, time.Now())
	if e == nil {
		return verdict{}
	}
	c.fromCache = true
	return m.replay(c, e.fp, e.rec)
}

// follow waits for the request of this process that leads the key's flight,
// and replays its answer. A request that differs from the leader's is
// refused at once: waiting could not make it the same.
func (m *Middleware) follow(c *call, fl *flight) verdict {
	if fl.fp != c.fp {
		return refuse(ErrKeyReused)
	}
	timer := time.NewTimer(time.Until(c.deadline))
	defer timer.Stop()
	began := time.Now()
	select {
	case <-fl.wait():
	case <-timer.C:
		c.waited += time.Since(began)
		return refuse(m.inProgress())
	case <-c.ctx.Done():
		c.waited += time.Since(began)
		return verdict{outcome: ClientGone} // nothing ran for this request
	}
	c.waited += time.Since(began)
	if fl.rec == nil {
		return verdict{}
	}
	return m.replay(c, fl.fp, fl.rec)
}

// lead answers the request through Redis, and shares a stored answer with
// the requests that follow it in this process, even when the handler
// panics (then with nothing to share).
func (m *Middleware) lead(c *call, fl *flight) (v verdict) {
	defer func() { m.flights.land(c.id, fl, v.shared()) }()
	l, v := m.claim(c)
	if l == nil {
		return v
	}
	if c.run != nil {
		return c.run(c, l)
	}
	return m.execute(c, l)
}
