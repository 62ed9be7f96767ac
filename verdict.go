package idempotency

import (
	"net/http"
	"time"
)

// A verdict is what a step decided about a request. The zero verdict means
// "go on to the next step".
type verdict struct {
	outcome Outcome
	// rec is the answer to replay (Replayed, Waited), or the answer the
	// handler gave and that was stored (Executed), for followers to share.
	rec *record
	// decode: rec's body goes out decoded, for a request that does not
	// accept its coding (negotiate).
	decode bool
	err    error // the problem to answer, or a failure to report
	// What became of an executed handler's answer, for the observer.
	released  bool
	storedFor time.Duration
}

func (v verdict) decided() bool { return v.outcome != 0 }

// shared is the stored answer that requests following this one in the
// process may replay.
func (v verdict) shared() *record {
	if v.outcome == Executed || v.outcome == Replayed || v.outcome == Waited {
		return v.rec
	}
	return nil
}

// refuse is the verdict that answers err with the error handler. Its
// outcome follows the status of err's problem: the problem table is the one
// place that knows which errors are conflicts.
func refuse(err error) verdict {
	switch problemFor(err).status {
	case http.StatusServiceUnavailable:
		return verdict{outcome: StoreError, err: err}
	case http.StatusConflict:
		return verdict{outcome: Conflict, err: err}
	}
	return verdict{outcome: Rejected, err: err}
}

// replay is the verdict that replays rec, unless it answered a different
// request or cannot be served under this request's negotiation: every
// path to a stored answer comes through here.
func (m *Middleware) replay(c *call, fp fingerprintSum, rec *record) verdict {
	var decode bool
	if fp != c.fp {
		return refuse(ErrKeyReused)
	}
	if c.r != nil {
		var err error
		if decode, err = rec.negotiate(c.r.Header); err != nil {
			return refuse(err)
		}
	}
	if c.waited > 0 {
		return verdict{outcome: Waited, rec: rec, decode: decode}
	}
	return verdict{outcome: Replayed, rec: rec, decode: decode}
}

// write writes v to the client, unless the handler already answered or
// nobody listens, and notes what it says of an outage.
func (m *Middleware) write(c *call, v verdict) {
	if !(costing && cost.noOutage) {
		c.outage = m.outage.note(m.cfg.logger, v, !c.fromCache && !m.cfg.failOpen, time.Now())
	}
	switch v.outcome {
	case Replayed, Waited:
		v.rec.write(c.w, c.r, &m.cfg, v.decode)
	case Executed, ClientGone, Unprotected:
	default:
		m.cfg.errorHandler(c.w, c.r, v.err)
	}
}
