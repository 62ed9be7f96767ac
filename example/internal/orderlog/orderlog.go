// Package orderlog is the side effect of an order event, as the shop's
// callbacks and the relay's in-process mode both run it: the event's state,
// written under the execution's fencing token, and one entry per event in a
// log that a reader (a person, a test) checks for anything done twice.
//
// The entry is written once per event, whatever runs it again. A write whose
// reply is lost (Redis stalled, a timeout) may have landed, and the
// execution cannot tell: it fails, its key is released or taken over, and a
// redelivery runs again. An effect that is not conditional on the message
// key then happens twice, however well the middleware keeps its own
// promise. So the entry goes in with HSETNX under the event (in SQL, an
// INSERT that the event's row refuses), and an execution that finds its
// event recorded already counts as a rerun instead: the count shows every
// execution past the first, which is what a reader checks against the
// failures that allowed them.
package orderlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/input"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/redis/go-redis/v9"
)

// ErrCorruptEntry is an entry of the log that does not decode.
var ErrCorruptEntry = errors.New("orderlog: corrupt entry")

// MaxWork caps the extra work an event may ask for (work_ms), so that a
// demo event cannot hold a handler for long.
const MaxWork = 10 * time.Second

// Event is what an order callback or message carries.
type Event struct {
	Order  int64  `json:"order"`
	Status string `json:"status"`
	// WorkMS adds simulated work to this one event (at most MaxWork), to
	// show what a slow handler does to a broker's redelivery.
	WorkMS int `json:"work_ms,omitempty"`
}

// Valid reports whether the event names an order, and its status (if
// any) is up to 64 bytes of printable text.
func (ev Event) Valid() bool {
	return ev.Order > 0 && (ev.Status == "" || input.Text(ev.Status, 64))
}

// Work is how long handling the event takes on top of base.
func (ev Event) Work(base time.Duration) time.Duration {
	return base + min(time.Duration(ev.WorkMS)*time.Millisecond, MaxWork)
}

// Effect is the entry of one event: the execution that recorded it.
type Effect struct {
	Key string `json:"key"` // as the client sent it
	// Event names the event in the log: the execution's record key, which
	// holds the key's scope (two CloudEvent sources' equal ids differ).
	Event     string    `json:"event"`
	Order     int64     `json:"order"`
	Status    string    `json:"status"`
	Fence     uint64    `json:"fence"`
	Instance  string    `json:"instance"`
	HandledAt time.Time `json:"handled_at"`
}

// Log is the order log under one name, kept in Redis (New) or in SQL
// (NewSQL). An event is named by its execution's record key
// (idempotency.Execution.Key): the key a client sent, within its scope, so
// two clients' equal keys are two events.
type Log struct {
	store    store
	instance string // who ran an execution, in its entry
}

// store is where a Log keeps its entries, its reruns and each event's
// state.
type store interface {
	// setState writes the event's state under e.Fence, refused with
	// optimistic.ErrStaleFence when a higher fence wrote it.
	setState(ctx context.Context, event string, e Effect) error
	// addEntry writes the event's entry unless it has one, and reports
	// whether it wrote it.
	addEntry(ctx context.Context, event string, entry []byte) (bool, error)
	// entry reads the event's entry.
	entry(ctx context.Context, event string) ([]byte, error)
	// addRerun adds member to the set of reruns.
	addRerun(ctx context.Context, member string) error
	// entries reads every entry, each under a name of its event.
	entries(ctx context.Context) (map[string][]byte, error)
	// reruns counts the set of reruns.
	reruns(ctx context.Context) (int64, error)
}

// New returns the log called name in Redis, written by instance. Its keys
// are the entries hash (name), the set of reruns (name:reruns, "KEY FENCE"
// each) and a state hash per event (name:state:DIGEST).
func New(rdb redis.UniversalClient, name, instance string) *Log {
	return &Log{store: redisStore{rdb: rdb, name: name}, instance: instance}
}

// writeBound bounds the writes of one execution once they are under way.
const writeBound = 30 * time.Second

// Record is one execution of the event that arrived under key, run in the
// protected execution of ctx. It writes the event's state under the
// execution's fencing token, refused with optimistic.ErrStaleFence when
// another execution took the key over meanwhile, then the event's entry
// unless it has one. It returns the event's entry, and rerun true when an
// earlier execution had written it.
//
// Once the writes have begun, the middleware cutting the execution off
// (its lease lost in a Redis stall, so that a redelivery may take the key
// over) does not abandon them: a write already sent may land when Redis
// resumes, and an execution that gave up on it would fail while its effect
// stands, to be run again. It waits for its writes instead (up to
// writeBound), and the fence refuses the state of an execution whose key
// was taken over meanwhile.
func (l *Log) Record(ctx context.Context, key string, ev Event) (entry Effect, rerun bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeBound)
	defer cancel()
	event := key
	if e, ok := idempotency.ExecutionOf(ctx); ok {
		event = e.Key
	}
	mine := Effect{
		Key: key, Event: event, Order: ev.Order, Status: ev.Status, Fence: idempotency.FencingToken(ctx),
		Instance: l.instance, HandledAt: time.Now().UTC(),
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("recording order %d: %w", ev.Order, err)
		}
	}()
	if err = l.store.setState(ctx, event, mine); err != nil {
		return mine, false, err
	}
	encoded, _ := json.Marshal(mine)
	fresh, err := l.store.addEntry(ctx, event, encoded)
	if err != nil || fresh {
		return mine, false, err
	}
	return l.rerun(ctx, mine)
}

// rerun reads the event's entry, which an execution found there, and
// records the execution as a rerun (once however often it writes) unless
// the entry is its own: go-redis resends a command whose reply was lost,
// and the resent HSETNX finds the entry that the first one wrote.
func (l *Log) rerun(ctx context.Context, mine Effect) (Effect, bool, error) {
	stored, err := l.store.entry(ctx, mine.Event)
	if err != nil {
		return Effect{}, false, err
	}
	var first Effect
	if err := json.Unmarshal(stored, &first); err != nil {
		return Effect{}, false, fmt.Errorf("%w: entry of %q: %v", ErrCorruptEntry, mine.Event, err)
	}
	if first.Fence == mine.Fence {
		return first, false, nil
	}
	err = l.store.addRerun(ctx, mine.Key+" "+strconv.FormatUint(mine.Fence, 10))
	return first, true, err
}

// Effects returns every event's entry, in the order they were handled.
func (l *Log) Effects(ctx context.Context) ([]Effect, error) {
	entries, err := l.store.entries(ctx)
	if err != nil {
		return nil, err
	}
	effects := make([]Effect, 0, len(entries))
	for key, e := range entries {
		var effect Effect
		if err := json.Unmarshal(e, &effect); err != nil {
			return nil, fmt.Errorf("%w: entry of %q: %v", ErrCorruptEntry, key, err)
		}
		effects = append(effects, effect)
	}
	sort.Slice(effects, func(i, j int) bool { return effects[i].HandledAt.Before(effects[j].HandledAt) })
	return effects, nil
}

// Reruns is how many executions found their event recorded already.
func (l *Log) Reruns(ctx context.Context) (int64, error) { return l.store.reruns(ctx) }

// redisStore keeps a log in Redis: the entries in one hash, HSETNX per
// event; the reruns in a set; each event's state in a hash of its own,
// fenced by optimistic.Hash.FencedSet.
type redisStore struct {
	rdb  redis.UniversalClient
	name string
	hash optimistic.Hash
}

func (s redisStore) setState(ctx context.Context, event string, e Effect) error {
	return s.hash.FencedSet(ctx, s.rdb, s.stateKey(event), e.Fence, map[string]any{
		"order": e.Order, "status": e.Status, "instance": e.Instance,
		"handled_at": e.HandledAt.Format(time.RFC3339Nano),
	})
}

func (s redisStore) addEntry(ctx context.Context, event string, entry []byte) (bool, error) {
	return s.rdb.HSetNX(ctx, s.name, event, entry).Result()
}

func (s redisStore) entry(ctx context.Context, event string) ([]byte, error) {
	return s.rdb.HGet(ctx, s.name, event).Bytes()
}

func (s redisStore) addRerun(ctx context.Context, member string) error {
	return s.rdb.SAdd(ctx, s.rerunsKey(), member).Err()
}

func (s redisStore) entries(ctx context.Context) (map[string][]byte, error) {
	all, err := s.rdb.HGetAll(ctx, s.name).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(all))
	for event, e := range all {
		out[event] = []byte(e)
	}
	return out, nil
}

func (s redisStore) reruns(ctx context.Context) (int64, error) {
	return s.rdb.SCard(ctx, s.rerunsKey()).Result()
}

func (s redisStore) rerunsKey() string { return s.name + ":reruns" }

// stateKey names the hash that holds an event's state, after a digest of
// its name (a key is the client's, of any length).
func (s redisStore) stateKey(event string) string {
	return s.name + ":state:" + digest(event)[:16]
}

// digest names an event, or a rerun, by the SHA-256 of its name in hex.
func digest(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])
}
