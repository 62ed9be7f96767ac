package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/orderlog"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Do's outcomes are judged as the answers the middleware would send for
// them.
func TestDoAnswer(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := retryPolicy{base: time.Second, max: 30 * time.Second, maxServerErrors: 5}
	failed := errors.New("payment provider: connection reset")
	tests := []struct {
		name      string
		err       error
		ran       bool
		delivered uint64
		want      verdict
		replayed  bool
	}{
		{"ran", nil, true, 1, verdict{action: ack}, false},
		{"replayed", nil, false, 2, verdict{action: ack}, true},
		{"in progress", idempotency.ErrInProgress, false, 2, verdict{action: retry, delay: time.Second, reason: "in progress"}, false},
		{"store down", fmt.Errorf("%w: dial tcp: i/o timeout", idempotency.ErrStoreUnavailable), false, 1,
			verdict{action: retry, delay: time.Second, reason: "Service Unavailable"}, false},
		{"not replayable ran", idempotency.ErrNotReplayable, false, 2, verdict{action: ack}, false},
		{"interrupted", idempotency.ErrInterrupted, false, 2, verdict{action: deadLetter, reason: "interrupted: the execution that claimed it vanished"}, false},
		{"key reused", idempotency.ErrKeyReused, false, 1, verdict{action: deadLetter, reason: "422 Unprocessable Entity: key-reused"}, false},
		{"unreadable record", idempotency.ErrUnreadableRecord, false, 1, verdict{action: deadLetter, reason: "conflict unreadable-record"}, false},
		{"key too long for the middleware", idempotency.ErrInvalidKey, false, 1, verdict{action: deadLetter, reason: "400 Bad Request: invalid-key"}, false},
		{"failed", failed, true, 1, verdict{action: retry, delay: time.Second, reason: "Internal Server Error: " + failed.Error()}, false},
		{"failed again", failed, true, 4, verdict{action: retry, delay: 8 * time.Second, reason: "Internal Server Error: " + failed.Error()}, false},
		{"failed for good", failed, true, 5, verdict{action: deadLetter, reason: "500 Internal Server Error: " + failed.Error()}, false},
		{"stored error", &idempotency.StoredError{Message: "out of stock"}, false, 2, verdict{action: retry, delay: 2 * time.Second, reason: "Internal Server Error: out of stock"}, false},
		{"permanent", Permanent(errors.New("no such order")), true, 1, verdict{action: deadLetter, reason: "422 Unprocessable Entity: no such order"}, false},
		{"permanent wrapped", fmt.Errorf("order 7: %w", Permanent(errors.New("no such order"))), true, 1,
			verdict{action: deadLetter, reason: "422 Unprocessable Entity: order 7: no such order"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := doAnswer(tc.err, tc.ran)
			require.Equal(t, tc.want, p.judge(a, tc.delivered, now))
			require.Equal(t, tc.replayed, a.replayed)
		})
	}
}

func TestRunNeedsOneSideEffect(t *testing.T) {
	process := func(context.Context, string, jetstream.Msg) error { return nil }
	for name, r := range map[string]*Relay{
		"neither":            {},
		"both":               {Target: "http://127.0.0.1:1/", Process: process},
		"no middleware":      {Process: process},
		"middleware, target": {Target: "http://127.0.0.1:1/", Middleware: &idempotency.Middleware{}, Process: process},
	} {
		require.Error(t, r.Run(context.Background()), name)
	}
}

// Process fails in three ways: a panic on every run is retried like a 5xx
// and then dead-lettered, a failure on the first run only is run again
// (the failed run released the key) and acked, and a Permanent error is
// dead-lettered at once.
func TestProcessFailures(t *testing.T) {
	rdb := redistest.Private(t)
	s := startInProcess(t, rdb, time.Millisecond).(*inProcess)
	b := startBroker(t, jetstream.StreamConfig{})
	b.createConsumer(t, 5*time.Second)

	var mu sync.Mutex
	runs := map[int64]int{}
	r := b.startRelay(t, processFunc{mw: s.mw, fn: func(ctx context.Context, key string, msg jetstream.Msg) error {
		var ev orderlog.Event
		json.Unmarshal(msg.Data(), &ev)
		mu.Lock()
		runs[ev.Order]++
		n := runs[ev.Order]
		mu.Unlock()
		switch {
		case ev.Order == 1:
			panic("out of cheese")
		case ev.Order == 2 && n == 1:
			return errors.New("payment provider: connection reset")
		}
		return s.log.process(ctx, key, msg)
	}}, 4)

	b.publish(t, 3, func(i int) map[string]any {
		if i == 3 {
			return map[string]any{"order": -3}
		}
		return paidOrder(i)
	}, nil)
	b.waitSettled(t, 20*time.Second)

	mu.Lock()
	require.Equal(t, map[int64]int{1: 5, 2: 2, -3: 1}, runs)
	mu.Unlock()
	effects := s.effects(t)
	require.Len(t, effects.entries, 1)
	require.EqualValues(t, 2, effects.entries[0].Order)
	require.Zero(t, effects.reruns, "the failed run of order 2 wrote nothing")
	dead := map[string]*jetstream.RawStreamMsg{}
	for _, dl := range b.deadLetters(t) {
		dead[dl.Header.Get("Relay-Sequence")] = dl
	}
	require.Len(t, dead, 2)
	require.NotNil(t, dead["1"])
	require.NotNil(t, dead["3"])
	require.Equal(t, "500", dead["1"].Header.Get("Relay-Status"))
	require.Equal(t, "500 Internal Server Error: panic: out of cheese", dead["1"].Header.Get("Relay-Reason"))
	require.Equal(t, "422", dead["3"].Header.Get("Relay-Status"))
	require.Contains(t, dead["3"].Header.Get("Relay-Reason"), "not an order event")
	require.EqualValues(t, 8, r.Stats.Delivered.Load())
	require.EqualValues(t, 6, r.Stats.Status(http.StatusInternalServerError))
	require.EqualValues(t, 5, r.Stats.Retried.Load())
	require.EqualValues(t, 1, r.Stats.Acked.Load())
	require.EqualValues(t, 2, r.Stats.DeadLettered.Load())
}

// processFunc is a side effect of the in-process mode given as a function,
// which counts its executions itself.
type processFunc struct {
	fn func(ctx context.Context, key string, msg jetstream.Msg) error
	mw *idempotency.Middleware
}

func (p processFunc) attach(r *Relay) { r.Process, r.Middleware = p.fn, p.mw }

func (p processFunc) effects(*testing.T) recorded { return recorded{} }
