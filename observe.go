package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"
)

// An Event describes one protected request once the middleware is done with
// it, for WithObserver.
type Event struct {
	Request      *http.Request   // nil for a function call (Do)
	Context      context.Context // the request's, or the context Do was given
	TokenMode    bool
	Outcome      Outcome
	FromCache    bool          // Replayed from this process's memory
	Err          error         // see the Outcome constants
	Start        time.Time     // when the middleware received the request
	Duration     time.Duration // time in the middleware, the handler included
	Wait         time.Duration // time spent waiting for another request with the same key
	FencingToken uint64        // of the execution, when Executed
	// Released is set when the handler's answer was not stored but its key
	// released, so that a retry runs again (the store policy, or Release).
	Released bool
	// StoredFor is how long the handler's answer is kept for replay, when
	// Executed and stored.
	StoredFor time.Duration
	// Outage is set on the request that began an outage (protected routes
	// refusing because Redis does not answer), on a refused one every 10 s
	// while it goes on, and on the one that ended it; nil on every other.
	// The request's own Outcome stays what it was (StoreError for a
	// refusal), so counting by Outcome counts requests still.
	Outage *Outage
}

// Mode names how the call was keyed: "token" (Protect), "key" (ProtectKey)
// or "function" (Do), as LogObserver and otelidem label it.
func (e Event) Mode() string {
	switch {
	case e.Request == nil:
		return "function"
	case e.TokenMode:
		return "token"
	}
	return "key"
}

// LogObserver logs every event to l: executions, replays and waits at
// debug level, conflicts and rejections at info, store errors (and
// executions whose answer was lost) at error. An event that reports an
// outage (Event.Outage) carries its phase, count refused and duration, at
// info level at least, so that its end shows beside its beginning.
func LogObserver(l *slog.Logger) func(Event) {
	return func(e Event) {
		level := slog.LevelDebug
		switch {
		case e.Outcome == StoreError, e.Outcome == Executed && e.Err != nil:
			level = slog.LevelError
		case e.Outcome == Conflict, e.Outcome == Rejected, e.Outage != nil:
			level = slog.LevelInfo
		}
		attrs := []slog.Attr{slog.String("outcome", e.Outcome.String())}
		if e.Request != nil {
			attrs = append(attrs, slog.String("method", e.Request.Method), slog.String("path", e.Request.URL.Path))
		}
		attrs = append(attrs, slog.Duration("duration", e.Duration), slog.String("mode", e.Mode()))
		if e.Wait > 0 {
			attrs = append(attrs, slog.Duration("wait", e.Wait))
		}
		if e.FromCache {
			attrs = append(attrs, slog.Bool("from_cache", true))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		if o := e.Outage; o != nil {
			attrs = append(attrs, slog.Group("outage", slog.String("phase", o.Phase.String()),
				slog.Int64("refused", o.Refused), slog.Duration("for", o.Duration)))
		}
		ctx := e.Context
		switch { // an Event built by hand may lack it
		case ctx == nil && e.Request != nil:
			ctx = e.Request.Context()
		case ctx == nil:
			ctx = context.Background()
		}
		l.LogAttrs(ctx, level, "idempotency", attrs...)
	}
}

// Refused reports to the observer (WithObserver) a call that an adapter
// over Do refused before Do could run, such as grpcidem's call without the
// key it requires, with a malformed one, or without a caller identity. The
// Event is a function call's (Request nil) with the Outcome the HTTP
// middleware reports for err (Rejected for ErrMissingKey, ErrInvalidKey
// and ErrNoScope), so that every adapter's refusals count alike. It
// returns err.
func (m *Middleware) Refused(ctx context.Context, err error) error {
	m.observe(&call{ctx: ctx, start: time.Now()}, refuse(err))
	return err
}

// observe reports c, answered as v, to the observer, if there is one. An
// observer that panics is logged: the answer went out, or is going out,
// and a panic let through would cut its connection (or reach Do's
// caller), on every request of the route.
func (m *Middleware) observe(c *call, v verdict) {
	if m.cfg.observer == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			m.cfg.logger.Error("idempotency: the observer (WithObserver) panicked; the answer stands",
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	m.cfg.observer(Event{
		Request: c.r, Context: c.ctx, TokenMode: c.tokenMode, Outcome: v.outcome, FromCache: c.fromCache, Err: v.err,
		Start: c.start, Duration: time.Since(c.start), Wait: c.waited, FencingToken: c.fence,
		Released: v.released, StoredFor: v.storedFor, Outage: c.outage,
	})
}
