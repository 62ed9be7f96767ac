package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/orderlog"
)

// orderProcess is the side effect of the in-process mode, the one the
// example shop's POST /callbacks/orders has: after the event's simulated
// work, each execution records the event in the order log (its state under
// the execution's fencing token, its entry once per event).
//
// The fence is what lets a middleware with WithRetryAbandoned take over a
// key whose execution stalled: the stalled one can no longer write the
// state after the execution that took it over.
type orderProcess struct {
	log    *orderlog.Log
	work   time.Duration // simulated work of every event
	logger *slog.Logger  // one Info line per execution; nil: none
}

// process is a Relay's Process.
func (o *orderProcess) process(ctx context.Context, key string, msg jetstream.Msg) error {
	var ev orderlog.Event
	if err := json.Unmarshal(msg.Data(), &ev); err != nil || !ev.Valid() {
		return Permanent(errors.New("not an order event: a JSON object with a positive order, and a status of up to 64 bytes of printable text"))
	}
	select {
	case <-time.After(ev.Work(o.work)):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	// ErrStaleFence: another execution took the key over while this one
	// stalled, and its outcome is the one stored; a retry replays it.
	entry, rerun, err := o.log.Record(ctx, key, ev)
	if err != nil {
		return err
	}
	if o.logger != nil {
		o.logger.Info("relay: order processed", "key", key, "order", ev.Order, "status", ev.Status,
			"fence", idempotency.FencingToken(ctx), "rerun", rerun, "recorded_by_fence", entry.Fence)
	}
	return nil
}
