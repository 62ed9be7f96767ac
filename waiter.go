package idempotency

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// watch subscribes to the key's waiters channel and raises its flag, so
// that the instance holding the lock publishes when it lets go. A waiting
// request then wakes within a round trip of the release instead of polling;
// keys that nobody waits for cost no message at all.
func (s *store) watch(ctx context.Context, k keys, until time.Duration) (*redis.PubSub, error) {
	channel := k.waiters()
	ps := s.client.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		ps.Close()
		return nil, err
	}
	if err := s.client.Set(ctx, channel, 1, max(until, time.Millisecond)).Err(); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}

// released waits up to d for the holder's message. Whatever it returns, the
// caller tries the lock again: a message can be missed (a reconnect), and
// the bounded wait is then the fallback.
func released(ctx context.Context, ps *redis.PubSub, d time.Duration) {
	ps.ReceiveTimeout(ctx, d)
}
