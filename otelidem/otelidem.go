// Package otelidem reports the idempotency middleware's work to
// OpenTelemetry: a counter and two histograms, and one span per protected
// request. It lives apart from the core so that only those who use
// OpenTelemetry import it.
//
//	obs, err := otelidem.NewObserver()
//	idem := idempotency.New(rdb, idempotency.WithObserver(obs))
package otelidem

import (
	"context"

	"github.com/onceonly/idempotency"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName names the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/onceonly/idempotency/otelidem"

// An Option configures NewObserver.
type Option func(*config)

type config struct {
	meters  metric.MeterProvider
	tracers trace.TracerProvider
}

// WithMeterProvider sets where the metrics go. Default otel.GetMeterProvider().
func WithMeterProvider(p metric.MeterProvider) Option { return func(c *config) { c.meters = p } }

// WithTracerProvider sets where the spans go. Default otel.GetTracerProvider().
func WithTracerProvider(p trace.TracerProvider) Option { return func(c *config) { c.tracers = p } }

// NewObserver returns an observer for idempotency.WithObserver that records:
//
//   - idempotency.requests (counter): protected requests, by outcome, mode
//     (token or key) and whether a replay came from memory;
//   - idempotency.duration (histogram, seconds): time in the middleware,
//     the handler included, by outcome and mode;
//   - idempotency.wait (histogram, seconds): time spent waiting for another
//     request with the same key, when there was any;
//   - idempotency.outage.active (up-down counter): 1 while protected routes
//     refuse requests because Redis does not answer, 0 once they answer
//     again (idempotency.Outage), summed over the middlewares observed;
//   - idempotency.outage.duration (histogram, seconds): how long each such
//     outage lasted, recorded when it ends;
//   - a span "idempotency" per request, a child of the request's own span,
//     covering the middleware's time, with the outcome and fencing token as
//     attributes, an error status for store errors and lost answers (the
//     error recorded: its text becomes exception.message), and an
//     event "idempotency.outage" on the request that began an outage, ended
//     it, or reported that it goes on.
func NewObserver(opts ...Option) (func(idempotency.Event), error) {
	c := config{meters: otel.GetMeterProvider(), tracers: otel.GetTracerProvider()}
	for _, o := range opts {
		o(&c)
	}
	meter := c.meters.Meter(ScopeName)
	requests, err := meter.Int64Counter("idempotency.requests",
		metric.WithDescription("Protected requests, by what the middleware did with them."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	duration, err := meter.Float64Histogram("idempotency.duration",
		metric.WithDescription("Time spent in the middleware, the handler included."), metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	wait, err := meter.Float64Histogram("idempotency.wait",
		metric.WithDescription("Time spent waiting for another request with the same key."), metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	outages, err := meter.Int64UpDownCounter("idempotency.outage.active",
		metric.WithDescription("Whether protected routes refuse requests because Redis does not answer."),
		metric.WithUnit("{outage}"))
	if err != nil {
		return nil, err
	}
	outageDuration, err := meter.Float64Histogram("idempotency.outage.duration",
		metric.WithDescription("How long protected routes refused requests because Redis did not answer."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(1, 5, 10, 30, 60, 300, 900, 3600))
	if err != nil {
		return nil, err
	}
	tracer := c.tracers.Tracer(ScopeName)

	return func(e idempotency.Event) {
		ctx := e.Context
		switch { // an Event built by hand may lack it
		case ctx == nil && e.Request != nil:
			ctx = e.Request.Context()
		case ctx == nil:
			ctx = context.Background()
		}
		attrs := attribute.NewSet(
			attribute.String("idempotency.outcome", e.Outcome.String()),
			attribute.String("idempotency.mode", e.Mode()),
			attribute.Bool("idempotency.from_cache", e.FromCache),
		)
		requests.Add(ctx, 1, metric.WithAttributeSet(attrs))
		duration.Record(ctx, e.Duration.Seconds(), metric.WithAttributeSet(attrs))
		if e.Wait > 0 {
			wait.Record(ctx, e.Wait.Seconds(), metric.WithAttributeSet(attrs))
		}

		switch {
		case e.Outage == nil:
		case e.Outage.Phase == idempotency.OutageBegan:
			outages.Add(ctx, 1)
		case e.Outage.Phase == idempotency.OutageEnded:
			outages.Add(ctx, -1)
			outageDuration.Record(ctx, e.Outage.Duration.Seconds())
		}

		_, span := tracer.Start(ctx, "idempotency", trace.WithTimestamp(e.Start),
			trace.WithAttributes(attrs.ToSlice()...))
		if e.FencingToken != 0 {
			span.SetAttributes(attribute.Int64("idempotency.fencing_token", int64(e.FencingToken)))
		}
		if e.Wait > 0 {
			span.SetAttributes(attribute.Float64("idempotency.wait_seconds", e.Wait.Seconds()))
		}
		if o := e.Outage; o != nil {
			span.AddEvent("idempotency.outage", trace.WithAttributes(
				attribute.String("idempotency.outage.phase", o.Phase.String()),
				attribute.Int64("idempotency.outage.refused", o.Refused),
				attribute.Float64("idempotency.outage.duration_seconds", o.Duration.Seconds())))
		}
		if e.Err != nil && (e.Outcome == idempotency.StoreError || e.Outcome == idempotency.Executed) {
			span.RecordError(e.Err)
			span.SetStatus(codes.Error, e.Outcome.String())
		}
		span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
	}, nil
}
