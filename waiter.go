package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitRoom carries every cross-instance wait of a Middleware over one
// pub/sub connection, whatever the number of waiters: a connection per
// waiter would sit outside the client's pool, and a burst of waiters would
// take every connection Redis allows (maxclients) from the instances that
// have work to do.
//
// The first waiter for a key subscribes to its channel and the last one
// unsubscribes; the connection opens with the first key and closes with
// the last. One goroutine routes each message to the key's waiters. PUBLISH
// reaches the subscribers of every node of a Cluster, so the connection may
// be to any node; go-redis resubscribes after a reconnect, and a message
// lost meanwhile costs a waiter one of its bounded pauses.
//
// No waiter writes to the connection itself: go-redis holds the
// connection's lock while it dials, and a Redis that takes no new
// connection (maxclients) would hold every waiter behind one dial, past its
// wait timeout. Joining and leaving change the room's maps and queue the
// subscription's change; one goroutine writes the changes in order, each
// within the store timeout, and a waiter waits for its confirmation no
// longer than its own step.
type waitRoom struct {
	client  redis.UniversalClient
	timeout time.Duration // bounds each write of a subscription change
	mu      sync.Mutex
	ps      *redis.PubSub // nil while nobody waits
	keys    map[string]*watchedKey
	changes []subscriptionChange // to be written, in order
	writing bool                 // a goroutine writes changes
}

// subscriptionChange is a channel to subscribe to or leave on ps.
type subscriptionChange struct {
	ps        *redis.PubSub
	subscribe bool
	channel   string
}

// watchedKey is one subscribed channel and the waiters it wakes.
type watchedKey struct {
	waiters   map[*watcher]struct{}
	ready     chan struct{} // closed when Redis confirms the subscription
	confirmed bool
}

// watcher is one waiting request's end of a room: waitRoom on Redis,
// notifyRoom (sqlnotify.go) on a database that notifies.
type watcher struct {
	room    interface{ leave(*watcher) }
	channel string
	woken   chan struct{} // holds a release that came while it was not pausing
}

// stop ends w's wait.
func (w *watcher) stop() { w.room.leave(w) }

// wake tells w that the key's holder let go, unless it has been told
// already: a waiter that is not pausing keeps one release for its next
// pause; more would tell it nothing new.
func (w *watcher) wake() {
	select {
	case w.woken <- struct{}{}:
	default:
	}
}

// errNoSharedSubscription: the client cannot carry every channel on one
// connection (a Ring subscribes on the shard of a channel), so its
// waiters poll.
var errNoSharedSubscription = errors.New("no shared subscription for this client")

// watch subscribes to the key's waiters channel and raises its flag, so
// that the instance holding the lock publishes when it lets go. A waiting
// request then wakes within a round trip of the release instead of polling;
// keys that nobody waits for cost no message at all. The caller stops the
// watcher when its wait ends.
func (s *redisStore) watch(ctx context.Context, k keys, until time.Duration) (*watcher, error) {
	w, ready, err := s.waits.join(k.waiters())
	if err != nil {
		return nil, err
	}
	select {
	case <-ready:
	case <-ctx.Done():
		w.stop()
		return nil, ctx.Err()
	}
	if err := s.client.Set(ctx, w.channel, 1, max(until, time.Millisecond)).Err(); err != nil {
		w.stop()
		return nil, err
	}
	return w, nil
}

// join adds a waiter for channel, subscribing when it is the first, and
// returns it with the channel's confirmation.
func (r *waitRoom) join(channel string) (*watcher, <-chan struct{}, error) {
	if _, ring := r.client.(*redis.Ring); ring {
		return nil, nil, errNoSharedSubscription
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ps == nil {
		r.ps = r.client.Subscribe(context.Background())
		r.keys = make(map[string]*watchedKey)
		go r.route(r.ps, r.ps.ChannelWithSubscriptions())
	}
	wk := r.keys[channel]
	if wk == nil {
		wk = &watchedKey{waiters: make(map[*watcher]struct{}), ready: make(chan struct{})}
		r.keys[channel] = wk
		// Written, not awaited: the confirmation comes through route.
		r.change(subscriptionChange{ps: r.ps, subscribe: true, channel: channel})
	}
	w := &watcher{room: r, channel: channel, woken: make(chan struct{}, 1)}
	wk.waiters[w] = struct{}{}
	return w, wk.ready, nil
}

// leave ends w's wait: the last waiter of a channel unsubscribes, and the
// last of all closes the connection.
func (r *waitRoom) leave(w *watcher) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wk := r.keys[w.channel]
	delete(wk.waiters, w)
	if len(wk.waiters) > 0 {
		return
	}
	delete(r.keys, w.channel)
	if len(r.keys) == 0 {
		// Closing waits for go-redis's lock too, which a dial may hold;
		// nothing waits on this connection any more.
		go r.ps.Close()
		r.ps, r.keys = nil, nil
		return
	}
	r.change(subscriptionChange{ps: r.ps, channel: w.channel})
}

// change queues a subscription change, and starts its writer unless one
// runs; r.mu is held.
func (r *waitRoom) change(c subscriptionChange) {
	r.changes = append(r.changes, c)
	if !r.writing {
		r.writing = true
		go r.write()
	}
}

// write writes the queued changes in order until none is left. A failed
// write leaves the channel to go-redis, which subscribes again to every
// channel it was asked for when it reconnects (and forgets one it was asked
// to leave); a change to a connection closed since is refused at once.
func (r *waitRoom) write() {
	for {
		r.mu.Lock()
		if len(r.changes) == 0 {
			r.writing = false
			r.mu.Unlock()
			return
		}
		c := r.changes[0]
		r.changes[0] = subscriptionChange{}
		r.changes = r.changes[1:]
		r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		if c.subscribe {
			c.ps.Subscribe(ctx, c.channel)
		} else {
			c.ps.Unsubscribe(ctx, c.channel)
		}
		cancel()
	}
}

// route hands each message of ps to the waiters of its channel, until ps
// is closed.
func (r *waitRoom) route(ps *redis.PubSub, in <-chan any) {
	for msg := range in {
		r.mu.Lock()
		switch msg := msg.(type) {
		case *redis.Message:
			if wk := r.keys[msg.Channel]; wk != nil {
				for w := range wk.waiters {
					w.wake()
				}
			}
		case *redis.Subscription:
			// A confirmation of a closed connection's subscription says
			// nothing about this one.
			if wk := r.keys[msg.Channel]; r.ps == ps && msg.Kind == "subscribe" && wk != nil && !wk.confirmed {
				wk.confirmed = true
				close(wk.ready)
			}
		}
		r.mu.Unlock()
	}
}

// released waits up to d for the holder's message. Whatever it returns, the
// caller tries the lock again: a message can be missed (a reconnect), and
// the bounded wait is then the fallback.
func (w *watcher) released(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-w.woken:
	case <-timer.C:
	case <-ctx.Done():
	}
}
