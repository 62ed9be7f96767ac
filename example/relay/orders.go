package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/redis/go-redis/v9"
)

// maxEventWork caps the extra work an event may ask for (work_ms), as the
// shop's callback does.
const maxEventWork = 10 * time.Second

// orderEvent is what the relay's messages carry.
type orderEvent struct {
	Order  int64  `json:"order"`
	Status string `json:"status"`
	// WorkMS adds simulated work to this one event.
	WorkMS int `json:"work_ms,omitempty"`
}

// orderEffect is one execution of orderLog.process: what must happen once
// per event. It has the fields of the shop's callback entries, so that
// one reader counts both.
type orderEffect struct {
	Key       string    `json:"key"`
	Order     int64     `json:"order"`
	Status    string    `json:"status"`
	Fence     uint64    `json:"fence"`
	Instance  string    `json:"instance"`
	HandledAt time.Time `json:"handled_at"`
}

// orderLog is the side effect of the in-process mode, the one the example
// shop's POST /callbacks/orders has: each execution writes the event's
// state to a hash of its own with the execution's fencing token, then
// appends an entry to a Redis list. The list is not idempotent by itself,
// so any duplicate run shows there.
//
// The fence is what lets a middleware with WithRetryAbandoned take over a
// key whose execution stalled: the stalled one can no longer write the
// state after the execution that took it over.
type orderLog struct {
	rdb      redis.UniversalClient
	list     string        // the list of executions; state hashes are named after it
	work     time.Duration // simulated work of every event
	instance string        // who ran an execution, in its entry
	logger   *slog.Logger  // one Info line per execution; nil: none
	hash     optimistic.Hash
}

// process is a Relay's Process.
func (o *orderLog) process(ctx context.Context, key string, msg jetstream.Msg) error {
	var ev orderEvent
	if err := json.Unmarshal(msg.Data(), &ev); err != nil || ev.Order <= 0 {
		return Permanent(errors.New("not an order event: a JSON object with a positive order"))
	}
	work := o.work + min(time.Duration(ev.WorkMS)*time.Millisecond, maxEventWork)
	select {
	case <-time.After(work):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	effect := orderEffect{
		Key: key, Order: ev.Order, Status: ev.Status, Fence: idempotency.FencingToken(ctx),
		Instance: o.instance, HandledAt: time.Now().UTC(),
	}
	err := o.hash.FencedSet(ctx, o.rdb, o.list+":state:"+key, effect.Fence, map[string]any{
		"order": effect.Order, "status": effect.Status, "instance": effect.Instance,
		"handled_at": effect.HandledAt.Format(time.RFC3339Nano),
	})
	if err != nil {
		// ErrStaleFence: another execution took the key over while this one
		// stalled, and its outcome is the one stored; a retry replays it.
		return fmt.Errorf("recording order %d: %w", ev.Order, err)
	}
	entry, _ := json.Marshal(effect)
	if err := o.rdb.RPush(ctx, o.list, entry).Err(); err != nil {
		return fmt.Errorf("recording order %d: %w", ev.Order, err)
	}
	if o.logger != nil {
		o.logger.Info("relay: order processed", "key", key, "order", ev.Order, "status", ev.Status, "fence", effect.Fence)
	}
	return nil
}

// effects reads every execution so far.
func (o *orderLog) effects(ctx context.Context) ([]orderEffect, error) {
	entries, err := o.rdb.LRange(ctx, o.list, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	effects := make([]orderEffect, 0, len(entries))
	for _, e := range entries {
		var effect orderEffect
		if err := json.Unmarshal([]byte(e), &effect); err != nil {
			return nil, fmt.Errorf("entry %q: %w", e, err)
		}
		effects = append(effects, effect)
	}
	return effects, nil
}
