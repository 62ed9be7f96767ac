package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
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
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { testRedeliveredMessagesRunOnce(t, m) })
	}
}

func testRedeliveredMessagesRunOnce(t *testing.T, m mode) {
	const messages = 1000
	rdb := redistest.Private(t)
	s := m.start(t, rdb, 2*time.Millisecond)
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, 150*time.Millisecond)

	start := time.Now()
	b.publish(t, messages, func(i int) map[string]any {
		ev := paidOrder(i)
		if i%10 == 0 {
			ev["work_ms"] = 400 // 2.7 AckWaits
		}
		return ev
	}, nil)
	r := b.startRelay(t, s, 32)
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	effects := s.effects(t)
	requireOncePerMessage(t, effects, messages, 0)
	require.Greater(t, r.Stats.Delivered.Load(), int64(messages), "the broker redelivered")
	require.Positive(t, r.Stats.Replayed.Load(), "a redelivery replayed")
	require.Zero(t, r.Stats.DeadLettered.Load())
	require.Empty(t, b.deadLetters(t))
	t.Logf("%s: %d messages, %d deliveries (%d replayed answers, %d retries), %d side effects, settled in %v",
		m.name, messages, r.Stats.Delivered.Load(), r.Stats.Replayed.Load(), r.Stats.Retried.Load(),
		len(effects.entries), took.Round(time.Millisecond))
}

// Two relays share the durable consumer and two executors of the side
// effect share one Redis; one relay dies mid-batch. Its unacked messages
// come back to the other after AckWait, and what already ran on the first
// executor is replayed by the second. In-process, the executor is the
// relay: what it had started finishes and is stored, as Do lets a started
// function finish.
func TestRelayCrashLosesNothingAndRunsNothingTwice(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { testRelayCrash(t, m) })
	}
}

func testRelayCrash(t *testing.T, m mode) {
	const messages = 1000
	rdb := redistest.Private(t)
	executors := []sideEffect{m.start(t, rdb, 10*time.Millisecond), m.start(t, rdb, 10*time.Millisecond)}
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, time.Second)

	start := time.Now()
	b.publish(t, messages, paidOrder, nil)
	relays := []*runningRelay{b.startRelay(t, executors[0], 8), b.startRelay(t, executors[1], 8)}
	deadline := time.Now().Add(20 * time.Second)
	for relays[0].Stats.Acked.Load() < 200 {
		require.True(t, time.Now().Before(deadline), "the first relay acked only %d", relays[0].Stats.Acked.Load())
		time.Sleep(time.Millisecond)
	}
	relays[0].stop()
	killedAt := time.Since(start)
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	effects := executors[1].effects(t)
	perInstance := requireOncePerMessage(t, effects, messages, 0)
	require.Len(t, perInstance, 2, "both executors ran messages")
	require.Zero(t, total(relays, func(s *Stats) int64 { return s.DeadLettered.Load() }))
	require.Positive(t, relays[1].Stats.Replayed.Load(), "the second executor replayed what the first had run")
	t.Logf("%s: %d messages; relay 1 killed at %v after %d acks with %d deliveries abandoned; relay 2 acked %d (%d replayed); "+
		"%d deliveries in all; %d side effects (%v per executor); settled in %v",
		m.name, messages, killedAt.Round(time.Millisecond), relays[0].Stats.Acked.Load(), relays[0].Stats.Abandoned.Load(),
		relays[1].Stats.Acked.Load(), relays[1].Stats.Replayed.Load(),
		total(relays, func(s *Stats) int64 { return s.Delivered.Load() }),
		len(effects.entries), perInstance, took.Round(time.Millisecond))
}

// A publisher reuses a message id for a different event: the middleware
// refuses it as key-reused (422), and the relay dead-letters the message at
// once instead of retrying it forever. So does an invalid event.
func TestChangedBodyUnderTheSameIDIsDeadLettered(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { testChangedBody(t, m) })
	}
}

func testChangedBody(t *testing.T, m mode) {
	rdb := redistest.Private(t)
	s := m.start(t, rdb, time.Millisecond)
	// A short duplicate window, so that JetStream itself does not drop the
	// second publish of the id.
	b := startBroker(t, jetstream.StreamConfig{Duplicates: 100 * time.Millisecond})
	b.createConsumer(t, 5*time.Second)
	r := b.startRelay(t, s, 4)

	sameID := func(int) string { return "order-7-paid" }
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 7, "status": "paid"} }, sameID)
	b.waitSettled(t, 10*time.Second)
	time.Sleep(150 * time.Millisecond) // past the duplicate window
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 7, "status": "refunded"} }, sameID)
	b.publish(t, 1, func(int) map[string]any { return map[string]any{"order": 0} }, nil) // invalid
	b.waitSettled(t, 10*time.Second)

	effects := s.effects(t)
	require.Len(t, effects.entries, 1)
	require.Equal(t, "paid", effects.entries[0].Status)
	require.Zero(t, effects.reruns)
	dead := map[string]*jetstream.RawStreamMsg{}
	for _, dl := range b.deadLetters(t) {
		dead[dl.Header.Get("Relay-Sequence")] = dl
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
	require.Equal(t, strconv.Itoa(m.invalidStatus), invalid.Header.Get("Relay-Status"))
	require.Equal(t, "ORDERS:seq:3", invalid.Header.Get("Relay-Key"))
	require.EqualValues(t, 3, r.Stats.Delivered.Load(), "no message was retried")
	require.EqualValues(t, 2, r.Stats.DeadLettered.Load())
	t.Logf("%s: 3 messages, %d deliveries, %d side effect, %d dead letters: %q, %q",
		m.name, r.Stats.Delivered.Load(), len(effects.entries), len(dead),
		reused.Header.Get("Relay-Reason"), invalid.Header.Get("Relay-Reason"))
}

// Redis stops answering mid-batch: the middleware refuses with 503 store
// unavailable without running anything, the relay NAKs with the
// Retry-After delay, and once Redis is back the broker's redeliveries
// have each message's effect once. Only a message whose run failed (its
// write timed out while Redis was stopped) may run again.
func TestRedisOutageIsRetriedNotLost(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { testRedisOutage(t, m) })
	}
}

func testRedisOutage(t *testing.T, m mode) {
	const messages = 300
	rdb := redistest.Private(t)
	// Little work per message, so that most executions in flight when Redis
	// stops are inside the middleware's exchanges with it, not the side
	// effect.
	s := m.start(t, rdb, time.Millisecond)
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, 10*time.Second)

	start := time.Now()
	b.publish(t, messages, paidOrder, nil)
	r := b.startRelay(t, s, 8)
	deadline := time.Now().Add(20 * time.Second)
	for r.Stats.Acked.Load() < 100 {
		require.True(t, time.Now().Before(deadline), "acked only %d", r.Stats.Acked.Load())
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, rdb.Signal(syscall.SIGSTOP))
	pausedAt := time.Since(start)
	ackedAtPause := r.Stats.Acked.Load()
	// Stopped for 2 s, and on until a delivery was refused. Where each
	// worker is when Redis stops is the machine's timing: one inside the
	// side effect hears of the outage only when its lease runs out (the
	// side effect fails, 500), and only its next delivery is refused, a
	// store timeout later. On a loaded machine that can be every worker.
	paused := time.Now()
	for time.Since(paused) < 2*time.Second || r.Stats.Status(http.StatusServiceUnavailable) == 0 {
		require.Less(t, time.Since(paused), 20*time.Second, "no delivery was refused while Redis was stopped")
		time.Sleep(10 * time.Millisecond)
	}
	pause := time.Since(paused)
	ackedDuringPause := r.Stats.Acked.Load() - ackedAtPause
	require.NoError(t, rdb.Signal(syscall.SIGCONT))
	b.waitSettled(t, 40*time.Second)
	took := time.Since(start)

	// A stall shorter than the lease (3 s) loses no lease: nothing is cut
	// off, nothing is taken over, and no message runs again once its
	// effect is done. A longer one (a loaded machine) cuts runs off: one
	// cut before its effect answers 5xx and is taken over by its retry
	// (no rerun); one cut during its effect waits for its writes and stores
	// its answer, unless a retry's claim, queued in the stalled Redis, took
	// the key over first: that retry finds the effect done (a rerun, never
	// a second effect). A 503 from the middleware ran nothing.
	failedRuns := r.Stats.Status(http.StatusInternalServerError) + r.Stats.Status(http.StatusServiceUnavailable) +
		r.Stats.NetErrors.Load()
	maxReruns := int64(0)
	if pause >= 3*time.Second {
		maxReruns = failedRuns
	}
	effects := s.effects(t)
	requireOncePerMessage(t, effects, messages, maxReruns)
	require.Positive(t, r.Stats.Status(http.StatusServiceUnavailable), "the relay saw 503 while Redis was stopped")
	require.Positive(t, r.Stats.Retried.Load())
	require.Zero(t, r.Stats.DeadLettered.Load())
	require.Empty(t, b.deadLetters(t))
	t.Logf("%s: %d messages; Redis stopped at %v for %v with %d acked (%d acked during the pause); "+
		"%d deliveries, %d answers 503, %d retries, %d failed runs; %d side effects, %d reruns; settled in %v",
		m.name, messages, pausedAt.Round(time.Millisecond), pause.Round(time.Millisecond), ackedAtPause, ackedDuringPause,
		r.Stats.Delivered.Load(), r.Stats.Status(http.StatusServiceUnavailable), r.Stats.Retried.Load(), failedRuns,
		len(effects.entries), effects.reruns, took.Round(time.Millisecond))
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

	rec := s.effects(t)
	require.Zero(t, rec.reruns)
	effects := rec.entries
	require.Len(t, effects, 3)
	require.Equal(t, []int64{1, 2, 3}, []int64{effects[0].Order, effects[1].Order, effects[2].Order})
}
