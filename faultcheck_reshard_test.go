package idempotency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// TestFaultCheckReshard is the fault check's Redis Cluster reshard, a test
// of its own because TestFaultCheck's rig has one Redis. A slot migrates
// while requests of keys in it run on three instances: MIGRATING and
// IMPORTING, its keys moved one at a time (claims meet ASK, and TRYAGAIN
// while a key's lock and record are split between the two masters), then
// the slot given to its new master, which an instance whose slot map is
// from before the move reaches through MOVED. Plain, and with
// WithReplicaAcks, whose claims follow the redirections themselves.
//
// The promises: nothing runs twice; while the slot moves, a request gets
// its key's one answer, waits (409 in-progress) or is refused (503, and
// then ran nothing); once it has settled, every key's stored answer is
// replayed on every instance, never answered 503.
//
// The keys are issued tokens of one session: a token's keys carry its
// scope's hash tag, so all of them live in one slot.
func TestFaultCheckReshard(t *testing.T) {
	addrs := redistest.PrivateCluster(t, 3, 1)
	masters := ackingMasters(t, clusterOf(t, addrs, nil))
	for _, acks := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "with replica acks"}[acks], func(t *testing.T) {
			reshardUnderLoad(t, addrs, masters, acks)
		})
	}
}

// clusterOf is a client of the cluster at addrs; with slots, one whose
// slot map is always slots.
func clusterOf(t *testing.T, addrs []string, slots []redis.ClusterSlot) *redis.ClusterClient {
	opts := &redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true}
	if slots != nil {
		opts.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil }
	}
	c := redis.NewClusterClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// reshardKeys is how many keys of the moving slot a run sends.
const reshardKeys = 24

func reshardUnderLoad(t *testing.T, addrs []string, masters []*redis.Client, acks bool) {
	ctx := t.Context()
	prefix := fmt.Sprintf("reshard-%v", acks)
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(500 * time.Millisecond), WithStoreTimeout(time.Second),
		WithWaitTimeout(time.Second)}
	if acks {
		opts = append(opts, WithReplicaAcks(1, 300*time.Millisecond))
	}
	rdb := clusterOf(t, addrs, nil)
	before, err := rdb.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	shops := []*shop{newShopOn(t, rdb, opts...), newShopOn(t, clusterOf(t, addrs, nil), opts...),
		newShopOn(t, clusterOf(t, addrs, before), opts...)}
	runs := &reshardRuns{n: map[string]int{}}
	for _, s := range shops {
		s.handler = func(w http.ResponseWriter, r *http.Request) {
			runs.add(r.Header.Get(KeyHeader))
			time.Sleep(time.Duration(20+rand.IntN(130)) * time.Millisecond) // a run that spans a step of the move
			s.defaultHandler(w, r)
		}
	}
	c := shops[0].client()
	tokens := make([]string, reshardKeys)
	for i := range tokens {
		tokens[i] = shops[0].token(c)
	}
	k := tokenKeys(prefix, sessionOf(t, shops[0], c), tokens[0])
	move := startMove(t, rdb, masters, k.record)

	// Every key is sent again and again, to the three instances, until
	// after the move and until it has its answer; the first before the
	// move, the others first at moments spread over it.
	seen := &reshardAnswers{first: map[string]string{}}
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for i, tok := range tokens {
		clients.Go(func() {
			time.Sleep(time.Duration(i) * 60 * time.Millisecond)
			for n := 0; ; n++ {
				select {
				case <-stop:
					if seen.answered(tok) {
						return
					}
				default:
				}
				time.Sleep(time.Duration(30+rand.IntN(60)) * time.Millisecond)
				a := <-shops[(i+n)%len(shops)].postAsync(c, "/orders", tok, `{}`)
				if a.err != nil {
					t.Errorf("while the slot moves: %v", a.err)
					return
				}
				seen.check(t, tok, a.answer)
			}
		})
	}
	time.Sleep(600 * time.Millisecond)
	seen.moving.Store(true)
	move.run(t)
	seen.moving.Store(false)
	time.Sleep(500 * time.Millisecond) // the stale instance meets MOVED
	close(stop)
	clients.Wait()

	for _, tok := range tokens {
		for _, s := range shops {
			a := s.post(c, "/orders", tok, `{}`)
			require.Equal(t, http.StatusCreated, a.status, "after the move: %s", a.body)
			seen.check(t, tok, a)
			require.Equal(t, "true", a.header.Get(ReplayedHeader), "after the move, the key's answer is replayed")
		}
	}
	for tok, n := range runs.n {
		require.Equal(t, 1, n, "token %s ran %d times", tok, n)
	}
	require.Len(t, runs.n, reshardKeys)
	t.Logf("slot %d moved under %d keys: %s", move.slot, reshardKeys, seen)
}

// reshardRuns counts the runs of each key.
type reshardRuns struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *reshardRuns) add(key string) {
	r.mu.Lock()
	r.n[key]++
	r.mu.Unlock()
}

// reshardAnswers holds each key's first 201 and counts the answers.
type reshardAnswers struct {
	moving                                     atomic.Bool // the slot is on its way
	mu                                         sync.Mutex
	first                                      map[string]string
	created, replayed, waited, refused, during int
}

// check takes answer a of key tok: the key's one answer, or a wait, or a
// refusal. It may be called from any goroutine.
func (s *reshardAnswers) check(t *testing.T, tok string, a answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.moving.Load() {
		s.during++
	}
	switch {
	case a.status == http.StatusCreated:
		if first, ok := s.first[tok]; ok && first != a.body {
			t.Errorf("token %s answered %s, and %s before: two runs", tok, a.body, first)
		} else if !ok {
			s.first[tok] = a.body
		}
		if a.header.Get(ReplayedHeader) == "true" {
			s.replayed++
		} else {
			s.created++
		}
	case a.status == http.StatusConflict && strings.Contains(a.body, "in-progress"):
		s.waited++
	case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "store-unavailable"):
		s.refused++
	default:
		t.Errorf("while the slot moves: %d %s", a.status, a.body)
	}
}

func (s *reshardAnswers) answered(tok string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.first[tok]
	return ok
}

func (s *reshardAnswers) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d answers while it moved; %d first answers, %d replays, %d in-progress, %d refused 503",
		s.during, s.created, s.replayed, s.waited, s.refused)
}

// slotMove moves the slot of a key from its master to another.
type slotMove struct {
	slot           int
	source, target *redis.Client
	masters        []*redis.Client
}

func startMove(t *testing.T, rdb *redis.ClusterClient, masters []*redis.Client, key string) *slotMove {
	ctx := t.Context()
	source, err := rdb.MasterForKey(ctx, key)
	require.NoError(t, err)
	m := &slotMove{slot: int(rdb.ClusterKeySlot(ctx, key).Val()), source: source, masters: masters}
	for _, candidate := range masters {
		if candidate.Options().Addr != source.Options().Addr {
			m.target = candidate
			break
		}
	}
	return m
}

// run moves the slot: both ends marked, its keys migrated one at a time,
// then the slot given to the target on every master.
func (m *slotMove) run(t *testing.T) {
	ctx := t.Context()
	id := func(c *redis.Client) string { return c.Do(ctx, "CLUSTER", "MYID").Val().(string) }
	sourceID, targetID := id(m.source), id(m.target)
	require.NoError(t, m.target.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", sourceID).Err())
	require.NoError(t, m.source.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", targetID).Err())
	time.Sleep(300 * time.Millisecond) // new keys go to the target (ASK), the others stay
	host, port, _ := strings.Cut(m.target.Options().Addr, ":")
	deadline := time.Now().Add(10 * time.Second)
	for {
		keys, err := m.source.ClusterGetKeysInSlot(ctx, m.slot, 1).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the slot's keys move within 10 s")
		migrate := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, key := range keys {
			migrate = append(migrate, key)
		}
		require.NoError(t, m.source.Do(ctx, migrate...).Err())
		time.Sleep(80 * time.Millisecond) // requests meet the slot split between the two
	}
	time.Sleep(300 * time.Millisecond) // every key on the target, the slot still migrating: ASK
	require.NoError(t, m.target.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", targetID).Err())
	for _, c := range m.masters {
		require.NoError(t, c.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", targetID).Err())
	}
}
