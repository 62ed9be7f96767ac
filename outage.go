package idempotency

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// An outage is a stretch of time in which protected routes refuse requests
// because Redis does not answer (503 store-unavailable). The observer hears
// of every refusal; the log says when refusing began, how many requests it
// refused, and when it ended, in a line at each end and one every
// outageReportEvery in between: go-redis's dial errors say that Redis is
// unreachable, not that our routes are refusing, nor how many.
type outage struct {
	on       atomic.Bool // an outage goes on: answers need the lock only then
	mu       sync.Mutex
	since    time.Time // when the first refusal came; zero when routes answer
	refused  int64     // requests refused since then
	reported time.Time // when the last line was logged
}

// outageReportEvery is how often a line says that an outage goes on.
const outageReportEvery = 10 * time.Second

// note takes the verdict answered at now. A refusal because Redis did not
// answer begins or continues an outage; an answer that Redis took part in
// (a claim that ran the handler, a replay read from Redis) ends it. Other
// answers (a 400 decided before Redis was asked, a replay from this
// process's memory) say nothing about Redis.
func (o *outage) note(logger *slog.Logger, v verdict, fromRedis bool, now time.Time) {
	refused := v.outcome == StoreError && errors.Is(v.err, ErrStoreUnavailable)
	answered := fromRedis && (v.outcome == Executed || v.outcome == Replayed || v.outcome == Waited)
	if !refused && (!answered || !o.on.Load()) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case refused && o.since.IsZero():
		o.since, o.refused, o.reported = now, 1, now
		o.on.Store(true)
		logger.Warn("idempotency: protected routes are refusing requests (503): Redis does not answer",
			"refused", o.refused)
	case refused:
		o.refused++
		if now.Sub(o.reported) >= outageReportEvery {
			o.reported = now
			logger.Warn("idempotency: protected routes are still refusing requests (503): Redis does not answer",
				"refused", o.refused, "since", o.since, "for", now.Sub(o.since).Round(time.Millisecond))
		}
	case !o.since.IsZero():
		logger.Info("idempotency: protected routes answer again: Redis answers",
			"refused", o.refused, "for", now.Sub(o.since).Round(time.Millisecond))
		o.since, o.refused = time.Time{}, 0
		o.on.Store(false)
	}
}
