package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// An SQLListener carries a database's notifications to a Middleware of
// NewSQL, so that a duplicate waiting for a key's answer wakes when the
// key's holder lets go, instead of at its next poll. Package pgnotify is
// one, for PostgreSQL's LISTEN/NOTIFY.
type SQLListener interface {
	// Listen listens on channel and gives deliver the payload of each
	// notification, in order, until ctx ends. It calls listening once it
	// listens, and again after each reconnection: what was sent in
	// between is lost, and waiters then wake at their next poll. It
	// returns when ctx ends, or at once, with an error, when it can never
	// listen (a database or driver it cannot use).
	Listen(ctx context.Context, channel string, listening func(), deliver func(payload string)) error
}

// WithSQLListener has waiting duplicates of NewSQL on PostgreSQL woken by
// the database's notifications: pgnotify.Listener(db). A key's holder
// notifies when it lets go, only when a duplicate waits (the waiter marks
// the key's row), so keys nobody waits for cost nothing; without a
// listener, waiters poll (50 ms, growing to 500 ms). NewSQL on another
// database refuses it; New ignores it.
func WithSQLListener(l SQLListener) Option { return func(c *config) { c.sqlListener = l } }

// notifyRoom carries every wait of a Middleware of NewSQL over one
// listener, whatever the number of waiters, as waitRoom does on Redis.
// The listener listens on one channel for the whole table, each
// notification naming its key: it starts with the first waiter, and stops
// a while after the last one left (notifyIdle), so that a burst of waits
// does not pay a connection each time.
type notifyRoom struct {
	listener SQLListener
	channel  string
	cfg      *config

	mu        sync.Mutex
	keys      map[string]map[*watcher]struct{} // the waiters, by key id
	listening chan struct{}                    // closed once it listens; nil while it does not run
	stop      context.CancelFunc               // ends the listener
	idle      *time.Timer                      // stops it, once nobody waits
	failed    bool                             // the listener can never listen: waiters poll
}

// notifyIdle is how long a listener stays after the last waiter left;
// notifyConnectWait how long a waiter waits for a listener that does not
// listen yet before it polls instead; notifySlow how long a listener may
// take to listen before that is logged.
const (
	notifyIdle        = 30 * time.Second
	notifyConnectWait = 100 * time.Millisecond
	notifySlow        = 10 * time.Second
)

// sqlChannel is the channel a table's holders notify: the table's name,
// or a digest of it where PostgreSQL would cut the name short (63 bytes).
func sqlChannel(table string) string {
	if len(table) <= 63 {
		return table
	}
	sum := sha256.Sum256([]byte(table))
	return "idempotency_" + hex.EncodeToString(sum[:12])
}

func newNotifyRoom(l SQLListener, table string, cfg *config) *notifyRoom {
	return &notifyRoom{listener: l, channel: sqlChannel(table), cfg: cfg, keys: make(map[string]map[*watcher]struct{})}
}

// join adds a waiter for the key id, starting the listener when it does
// not run, and returns it with what closes once the listener listens. It
// returns nil when the listener can never listen.
func (r *notifyRoom) join(id string) (*watcher, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed {
		return nil, nil
	}
	if r.idle != nil {
		r.idle.Stop()
		r.idle = nil
	}
	if r.stop == nil {
		r.start()
	}
	w := &watcher{room: r, channel: id, woken: make(chan struct{}, 1)}
	if r.keys[id] == nil {
		r.keys[id] = make(map[*watcher]struct{})
	}
	r.keys[id][w] = struct{}{}
	return w, r.listening
}

// start runs the listener until r.stop; r.mu is held.
func (r *notifyRoom) start() {
	ctx, stop := context.WithCancel(context.Background())
	listening := make(chan struct{})
	r.stop, r.listening = stop, listening
	var once sync.Once
	// A listener that cannot connect retries on its own and says nothing:
	// its waiters poll, which the log should tell.
	slow := time.AfterFunc(notifySlow, func() {
		select {
		case <-listening:
		case <-ctx.Done():
		default:
			r.cfg.logger.Warn("idempotency: the SQL listener (WithSQLListener) has not listened for "+
				notifySlow.String()+" (the database refuses its connection, or cannot be reached); waiting "+
				"duplicates poll until it does", "channel", r.channel)
		}
	})
	go func() {
		defer slow.Stop()
		err := r.listener.Listen(ctx, r.channel, func() { once.Do(func() { close(listening) }) }, r.deliver)
		if err != nil && ctx.Err() == nil {
			r.mu.Lock()
			r.failed = true // before listening closes: its waiters poll
			r.mu.Unlock()
			r.cfg.logger.Error("idempotency: the SQL listener (WithSQLListener) cannot listen; waiting duplicates "+
				"poll instead", "channel", r.channel, "error", err)
		}
		once.Do(func() { close(listening) }) // nobody waits for a listener that ended
	}()
}

// ready reports whether r listens, once listening closed.
func (r *notifyRoom) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.failed
}

// deliver wakes the waiters of the key a notification names.
func (r *notifyRoom) deliver(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.keys[id] {
		w.wake()
	}
}

// leave ends w's wait; the last waiter to leave starts the idle time.
func (r *notifyRoom) leave(w *watcher) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys[w.channel], w)
	if len(r.keys[w.channel]) == 0 {
		delete(r.keys, w.channel)
	}
	if len(r.keys) > 0 || r.stop == nil || r.idle != nil {
		return
	}
	var idle *time.Timer
	idle = time.AfterFunc(notifyIdle, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.idle != idle { // a waiter came, or another timer took over
			return
		}
		r.stop()
		r.stop, r.listening, r.idle = nil, nil, nil
	})
	r.idle = idle
}
