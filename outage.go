package idempotency

import (
	"cmp"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// An Outage is a stretch of time in which protected routes refuse requests
// (503 store-unavailable) because Redis does not answer. The observer hears
// of it through Event.Outage, and the middleware's log (WithLogger) in a
// line, at the request that begins it, at a refusal every 10 s while it
// goes on (outageReportEvery), and at the request that ends it: go-redis's dial errors say that Redis is unreachable, not that our
// routes are refusing, nor how many requests.
//
// Only requests tell: the first refusal begins an outage, and the first
// answer that Redis took part in (a claim that ran the handler, a replay
// read from Redis) ends it. Answers decided without Redis (a 400, a replay
// from this process's memory) neither end nor count, and calls of Do are
// not followed.
type Outage struct {
	Phase OutagePhase
	// Since is when the first refusal came.
	Since time.Time
	// Refused counts the requests refused since then: this one included
	// when the outage began or goes on; when it ended, every refusal
	// before the request that ended it.
	Refused int64
	// Duration is how long it has lasted, from Since to this request.
	Duration time.Duration
}

// An OutagePhase says what a request's Event.Outage reports.
type OutagePhase int

const (
	// OutageBegan: this request is the first refused (Refused is 1).
	OutageBegan OutagePhase = iota + 1
	// OutageOngoing: this request was refused, and the outage has gone on
	// for another 10 s since it was last reported.
	OutageOngoing
	// OutageEnded: Redis answered this request, after Refused refusals.
	OutageEnded
)

var outagePhaseNames = [...]string{"", "began", "ongoing", "ended"}

func (p OutagePhase) String() string {
	if p > 0 && int(p) < len(outagePhaseNames) {
		return outagePhaseNames[p]
	}
	return "unknown"
}

// outageWatch follows one Middleware's outages.
type outageWatch struct {
	on       atomic.Bool // an outage goes on: answers need the lock only then
	store    string      // what does not answer, for the log: "Redis" unless named
	mu       sync.Mutex
	since    time.Time // when the first refusal came; zero when routes answer
	refused  int64     // requests refused since then
	reported time.Time // when the outage was last reported
}

// outageReportEvery is how often an outage that goes on is reported.
const outageReportEvery = 10 * time.Second

// note takes the verdict answered at now and returns what the request has
// to report of an outage (nil: nothing), which it has also logged. A
// refusal because Redis did not answer begins or continues an outage; an
// answer that Redis took part in ends it.
func (o *outageWatch) note(logger *slog.Logger, v verdict, fromRedis bool, now time.Time) *Outage {
	// A drain refuses new requests too, with Redis in reach: no outage.
	refused := v.outcome == StoreError && errors.Is(v.err, ErrStoreUnavailable) && !errors.Is(v.err, errShuttingDown)
	answered := fromRedis && (v.outcome == Executed || v.outcome == Replayed || v.outcome == Waited)
	if !refused && (!answered || !o.on.Load()) {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var phase OutagePhase
	switch {
	case refused && o.since.IsZero():
		o.since, o.refused, o.reported = now, 1, now
		o.on.Store(true)
		phase = OutageBegan
	case refused:
		o.refused++
		if now.Sub(o.reported) < outageReportEvery {
			return nil
		}
		o.reported = now
		phase = OutageOngoing
	case !o.since.IsZero():
		phase = OutageEnded
	default: // another request ended it since the check above
		return nil
	}
	news := &Outage{Phase: phase, Since: o.since, Refused: o.refused, Duration: now.Sub(o.since)}
	if phase == OutageEnded {
		o.since, o.refused = time.Time{}, 0
		o.on.Store(false)
	}
	news.log(logger, v.err, cmp.Or(o.store, "Redis"))
	return news
}

// log logs o; cause is why this request was refused, when it was, and
// store what did not answer.
func (o *Outage) log(logger *slog.Logger, cause error, store string) {
	took := o.Duration.Round(time.Millisecond)
	why := store + " does not answer"
	if full := (*poolFullError)(nil); errors.As(cause, &full) {
		// The requests queued for a connection: the database may be
		// fine, and the pool too small for the handlers' transactions.
		why = "no connection of db's pool came free: the database is slow to answer, or the handlers' " +
			"transactions hold every connection (size the pool, SetMaxOpenConns, for them too)"
	}
	switch o.Phase {
	case OutageBegan:
		logger.Warn("idempotency: protected routes are refusing requests (503): "+why,
			"refused", o.Refused, "error", cause)
	case OutageOngoing:
		logger.Warn("idempotency: protected routes are still refusing requests (503): "+why,
			"refused", o.Refused, "since", o.Since, "for", took, "error", cause)
	case OutageEnded:
		logger.Info("idempotency: protected routes answer again: "+store+" answers",
			"refused", o.Refused, "for", took)
	}
}
