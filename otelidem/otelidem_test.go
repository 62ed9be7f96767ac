package otelidem

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestObserverRecordsMetricsAndSpans(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := NewObserver(WithMeterProvider(meters), WithTracerProvider(tracers))
	require.NoError(t, err)

	rdb := redistest.Client(t, "otel-test")
	h := idempotency.New(rdb, idempotency.WithKeyPrefix("otel-test"), idempotency.WithCallerCredentials(), idempotency.WithObserver(obs)).
		ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
	// The request's own span, as an HTTP instrumentation would start it.
	ctx, parent := tracers.Tracer("test").Start(context.Background(), "POST /payments")
	send := func(key string) int {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(`{}`))
		if key != "" {
			r.Header.Set(idempotency.KeyHeader, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, http.StatusCreated, send("k"))
	require.Equal(t, http.StatusCreated, send("k"))
	require.Equal(t, http.StatusBadRequest, send(""))
	parent.End()

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	counts := map[string]int64{}
	var histograms []string
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != "idempotency.requests" {
					continue
				}
				for _, dp := range data.DataPoints {
					outcome, _ := dp.Attributes.Value("idempotency.outcome")
					cache, _ := dp.Attributes.Value("idempotency.from_cache")
					counts[outcome.AsString()+map[bool]string{true: "/cache", false: ""}[cache.AsBool()]] += dp.Value
				}
			case metricdata.Histogram[float64]:
				histograms = append(histograms, m.Name)
			}
		}
	}
	require.Equal(t, map[string]int64{"executed": 1, "replayed/cache": 1, "rejected": 1}, counts)
	require.Contains(t, histograms, "idempotency.duration")

	ended := spans.Ended()
	var mine []sdktrace.ReadOnlySpan
	for _, s := range ended {
		if s.Name() == "idempotency" {
			mine = append(mine, s)
		}
	}
	require.Len(t, mine, 3)
	for _, s := range mine {
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the request's span")
		require.False(t, s.EndTime().Before(s.StartTime()))
	}
	require.Contains(t, mine[0].Attributes(), attribute.String("idempotency.outcome", "executed"))
	var fenced bool
	for _, a := range mine[0].Attributes() {
		fenced = fenced || (a.Key == "idempotency.fencing_token" && a.Value.AsInt64() > 0)
	}
	require.True(t, fenced, "the execution's span carries its fencing token")
}

func TestObserverMarksStoreErrors(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	obs, err := NewObserver(WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
		WithMeterProvider(sdkmetric.NewMeterProvider()))
	require.NoError(t, err)
	obs(idempotency.Event{
		Request: httptest.NewRequest(http.MethodPost, "/payments", nil),
		Outcome: idempotency.StoreError, Err: idempotency.ErrStoreUnavailable,
	})
	require.Len(t, spans.Ended(), 1)
	require.Equal(t, "Error", spans.Ended()[0].Status().Code.String())
	require.NotEmpty(t, spans.Ended()[0].Events(), "the error is recorded")
}

// While protected routes refuse requests because Redis does not answer (a
// real redis-server, killed, then started again on its port), the outage
// gauge reads 1; once they answer again it reads 0, the outage's length is
// recorded, and the two requests that began and ended it carry a span event.
func TestObserverRecordsOutages(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := NewObserver(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	require.NoError(t, err)
	srv := redistest.Private(t)
	opts := srv.Options()
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	h := idempotency.New(rdb, idempotency.WithKeyPrefix("otel-outage"), idempotency.WithCallerCredentials(),
		idempotency.WithStoreTimeout(200*time.Millisecond), idempotency.WithObserver(obs)).
		ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	send := func(key string) int {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		r.Header.Set(idempotency.KeyHeader, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, http.StatusCreated, send("before"))

	srv.Stop()
	for _, key := range []string{"a", "b", "c"} {
		require.Equal(t, http.StatusServiceUnavailable, send(key))
	}
	active, _, _, refused := outageMetrics(t, reader)
	assert.Equal(t, int64(1), active, "protected routes are refusing")
	assert.Equal(t, int64(3), refused)

	redistest.Restart(t, srv)
	require.Eventually(t, func() bool { return send("after") == http.StatusCreated }, 10*time.Second, 50*time.Millisecond)
	active, ended, lasted, _ := outageMetrics(t, reader)
	assert.Zero(t, active, "protected routes answer again")
	assert.Equal(t, uint64(1), ended, "one outage ended")
	assert.Positive(t, lasted)

	var phases []string
	for _, s := range spans.Ended() {
		for _, ev := range s.Events() {
			if ev.Name != "idempotency.outage" {
				continue
			}
			for _, a := range ev.Attributes {
				if a.Key == "idempotency.outage.phase" {
					phases = append(phases, a.Value.AsString())
				}
			}
		}
	}
	assert.Equal(t, []string{"began", "ended"}, phases)
}

// outageMetrics reads the outage gauge, how many outages ended and their
// seconds in all, and the requests counted as store errors.
func outageMetrics(t *testing.T, reader *sdkmetric.ManualReader) (active int64, ended uint64, lasted float64, refused int64) {
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					switch outcome, _ := dp.Attributes.Value("idempotency.outcome"); {
					case m.Name == "idempotency.outage.active":
						active += dp.Value
					case m.Name == "idempotency.requests" && outcome.AsString() == "store_error":
						refused += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name != "idempotency.outage.duration" {
					continue
				}
				for _, dp := range data.DataPoints {
					ended += dp.Count
					lasted += dp.Sum
				}
			}
		}
	}
	return active, ended, lasted, refused
}
