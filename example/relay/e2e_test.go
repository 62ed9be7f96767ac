package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A tenth of the messages take longer than the consumer's AckWait, so the
// broker redelivers them while the first delivery is still running; the
// middleware makes the duplicates wait and replay.
func TestRedeliveredMessagesRunOnce(t *testing.T) {
	const messages = 1000
	rdb := redistest.Private(t)
	s := startShop(t, rdb.Addr(), "CALLBACK_LATENCY=2ms")
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, 150*time.Millisecond)

	start := time.Now()
	b.publish(t, messages, func(i int) map[string]any {
		ev := orderEvent(i)
		if i%10 == 0 {
			ev["work_ms"] = 400 // 2.7 AckWaits
		}
		return ev
	}, nil)
	r := b.startRelay(t, s.URL+"/callbacks/orders", 32)
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	requireOncePerMessage(t, s.effects(t), messages)
	require.Greater(t, r.Stats.Delivered.Load(), int64(messages), "the broker redelivered")
	require.Zero(t, r.Stats.DeadLettered.Load())
	require.Empty(t, b.deadLetters(t))
	t.Logf("%d messages, %d deliveries (%d replayed answers, %d retries), %d side effects, settled in %v",
		messages, r.Stats.Delivered.Load(), r.Stats.Replayed.Load(), r.Stats.Retried.Load(),
		len(s.effects(t)), took.Round(time.Millisecond))
}

// Two relays share the durable consumer and two shops share one Redis; one
// relay dies mid-batch. Its unacked messages come back to the other after
// AckWait, and what already ran on the first shop is replayed by the second.
func TestRelayCrashLosesNothingAndRunsNothingTwice(t *testing.T) {
	const messages = 1000
	rdb := redistest.Private(t)
	shops := []*shop{
		startShop(t, rdb.Addr(), "CALLBACK_LATENCY=10ms"),
		startShop(t, rdb.Addr(), "CALLBACK_LATENCY=10ms"),
	}
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, time.Second)

	start := time.Now()
	b.publish(t, messages, orderEvent, nil)
	relays := []*runningRelay{
		b.startRelay(t, shops[0].URL+"/callbacks/orders", 8),
		b.startRelay(t, shops[1].URL+"/callbacks/orders", 8),
	}
	deadline := time.Now().Add(20 * time.Second)
	for relays[0].Stats.Acked.Load() < 200 {
		require.True(t, time.Now().Before(deadline), "the first relay acked only %d", relays[0].Stats.Acked.Load())
		time.Sleep(time.Millisecond)
	}
	relays[0].stop()
	killedAt := time.Since(start)
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	perInstance := requireOncePerMessage(t, shops[1].effects(t), messages)
	require.Len(t, perInstance, 2, "both shops ran callbacks")
	require.Zero(t, total(relays, func(s *Stats) int64 { return s.DeadLettered.Load() }))
	require.Positive(t, relays[1].Stats.Replayed.Load(), "the second shop replayed what the first had run")
	t.Logf("%d messages; relay 1 killed at %v after %d acks with %d deliveries abandoned; relay 2 acked %d (%d replayed); "+
		"%d deliveries in all; %d side effects (%v per shop); settled in %v",
		messages, killedAt.Round(time.Millisecond), relays[0].Stats.Acked.Load(), relays[0].Stats.Abandoned.Load(),
		relays[1].Stats.Acked.Load(), relays[1].Stats.Replayed.Load(),
		total(relays, func(s *Stats) int64 { return s.Delivered.Load() }),
		len(shops[1].effects(t)), perInstance, took.Round(time.Millisecond))
}

// A publisher reuses a message id for a different event: the endpoint
// answers 422 key-reused, and the relay dead-letters the message at once
// instead of retrying it forever. So does any other 4xx.
func TestChangedBodyUnderTheSameIDIsDeadLettered(t *testing.T) {
	rdb := redistest.Private(t)
	s := startShop(t, rdb.Addr(), "CALLBACK_LATENCY=1ms")
	// A short duplicate window, so that JetStream itself does not drop the
	// second publish of the id.
	b := startBroker(t, jetstream.StreamConfig{Duplicates: 100 * time.Millisecond})
	b.createConsumer(t, 5*time.Second)
	r := b.startRelay(t, s.URL+"/callbacks/orders", 4)

	sameID := func(int) string { return "order-7-paid" }
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 7, "status": "paid"} }, sameID)
	b.waitSettled(t, 10*time.Second)
	time.Sleep(150 * time.Millisecond) // past the duplicate window
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 7, "status": "refunded"} }, sameID)
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 0} }, nil) // 400 invalid-event
	b.waitSettled(t, 10*time.Second)

	effects := s.effects(t)
	require.Len(t, effects, 1)
	require.Equal(t, "paid", effects[0].Status)
	dead := map[string]*jetstream.RawStreamMsg{}
	for _, m := range b.deadLetters(t) {
		dead[m.Header.Get("Relay-Sequence")] = m
	}
	require.Len(t, dead, 2)
	reused, invalid := dead["2"], dead["3"]
	require.NotNil(t, reused)
	require.Equal(t, "422", reused.Header.Get("Relay-Status"))
	require.Equal(t, "key-reused", reused.Header.Get("Relay-Problem"))
	require.Equal(t, "ORDERS:id:order-7-paid", reused.Header.Get("Relay-Key"))
	require.Equal(t, subject, reused.Header.Get("Relay-Subject"))
	require.JSONEq(t, `{"order":7,"status":"refunded"}`, string(reused.Data))
	require.NotNil(t, invalid)
	require.Equal(t, "400", invalid.Header.Get("Relay-Status"))
	require.Equal(t, "ORDERS:seq:3", invalid.Header.Get("Relay-Key"))
	require.EqualValues(t, 3, r.Stats.Delivered.Load(), "no message was retried")
	require.EqualValues(t, 2, r.Stats.DeadLettered.Load())
	t.Logf("3 messages, %d deliveries, %d side effect, %d dead letters: %q, %q",
		r.Stats.Delivered.Load(), len(effects), len(dead),
		reused.Header.Get("Relay-Reason"), invalid.Header.Get("Relay-Reason"))
}

// Redis stops answering mid-batch: the middleware answers 503 without
// running anything, the relay NAKs with the Retry-After delay, and once
// Redis is back the broker's redeliveries run each message once.
func TestRedisOutageIsRetriedNotLost(t *testing.T) {
	const messages = 300
	rdb := redistest.Private(t)
	// Little work per message, so that most requests in flight when Redis
	// stops are inside the middleware's exchanges with it, not the handler.
	s := startShop(t, rdb.Addr(), "CALLBACK_LATENCY=1ms")
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, 10*time.Second)

	start := time.Now()
	b.publish(t, messages, orderEvent, nil)
	r := b.startRelay(t, s.URL+"/callbacks/orders", 8)
	deadline := time.Now().Add(20 * time.Second)
	for r.Stats.Acked.Load() < 100 {
		require.True(t, time.Now().Before(deadline), "acked only %d", r.Stats.Acked.Load())
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, rdb.Signal(syscall.SIGSTOP))
	pausedAt := time.Since(start)
	ackedAtPause := r.Stats.Acked.Load()
	time.Sleep(2 * time.Second)
	ackedDuringPause := r.Stats.Acked.Load() - ackedAtPause
	require.NoError(t, rdb.Signal(syscall.SIGCONT))
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	requireOncePerMessage(t, s.effects(t), messages)
	require.Positive(t, r.Stats.Status(http.StatusServiceUnavailable), "the relay saw 503 while Redis was stopped")
	require.Positive(t, r.Stats.Retried.Load())
	require.Zero(t, r.Stats.DeadLettered.Load())
	require.Empty(t, b.deadLetters(t))
	t.Logf("%d messages; Redis stopped at %v for 2s with %d acked (%d acked during the pause); "+
		"%d deliveries, %d answers 503, %d retries; %d side effects; settled in %v",
		messages, pausedAt.Round(time.Millisecond), ackedAtPause, ackedDuringPause,
		r.Stats.Delivered.Load(), r.Stats.Status(http.StatusServiceUnavailable), r.Stats.Retried.Load(),
		len(s.effects(t)), took.Round(time.Millisecond))
}

// The example's CloudEvents route keys events by id within their source,
// in both modes of the HTTP binding.
func TestCloudEventsCallback(t *testing.T) {
	rdb := redistest.Private(t)
	s := startShop(t, rdb.Addr(), "CALLBACK_LATENCY=1ms")
	post := func(header http.Header, body string) int {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
			s.URL+"/callbacks/cloudevents/orders", strings.NewReader(body))
		require.NoError(t, err)
		req.Header = header
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	structured := func(id, source string, order int) string {
		return fmt.Sprintf(`{"specversion":"1.0","type":"order.paid","id":%q,"source":%q,"data":{"order":%d,"status":"paid"}}`, id, source, order)
	}
	ceJSON := http.Header{"Content-Type": {"application/cloudevents+json"}}
	binary := func(id, source string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Ce-Specversion": {"1.0"}, "Ce-Type": {"order.paid"},
			"Ce-Id": {id}, "Ce-Source": {source}}
	}
	for range 3 {
		require.Equal(t, http.StatusOK, post(ceJSON, structured("e1", "/eu", 1)))
		require.Equal(t, http.StatusOK, post(ceJSON, structured("e1", "/us", 2))) // another sender's e1
		require.Equal(t, http.StatusOK, post(binary("e2", "/eu"), `{"order":3,"status":"paid"}`))
	}
	require.Equal(t, http.StatusUnprocessableEntity, post(ceJSON, structured("e1", "/eu", 9)))
	require.Equal(t, http.StatusUnauthorized, post(binary("e3", ""), `{"order":4}`))

	effects := s.effects(t)
	require.Len(t, effects, 3)
	require.Equal(t, []int64{1, 2, 3}, []int64{effects[0].Order, effects[1].Order, effects[2].Order})
}
