package idempotency

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// awaitReplica waits until the primary's replica has synced and
// acknowledges writes: "online" alone can precede its first acknowledgement.
// WAIT counts acknowledgements of its own connection's writes, so the probe
// writes and waits on one connection.
func awaitReplica(t *testing.T, primary *redis.Client) {
	t.Helper()
	ctx := context.Background()
	conn := primary.Conn()
	defer conn.Close()
	require.Eventually(t, func() bool {
		return conn.Set(ctx, "replica-probe", "1", time.Minute).Err() == nil &&
			conn.Wait(ctx, 1, 100*time.Millisecond).Val() == 1
	}, 10*time.Second, 20*time.Millisecond, "the replica syncs and acknowledges")
}

func TestReplicaAcksFailClosedWithoutReplica(t *testing.T) {
	primary, replica := primaryWithReplica(t)
	rdb := primary.Client(t)

	s := newShopOn(t, rdb, WithReplicaAcks(1, 200*time.Millisecond))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", s.token(c), `{}`).status, "acknowledged by the replica")

	require.NoError(t, replica.Signal(syscall.SIGSTOP))
	tok := s.token(c)
	for i := range 3 {
		a := s.post(c, "/orders", tok, `{"try":`+strconv.Itoa(i)+`}`)
		requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
	}
	require.EqualValues(t, 1, s.execs.Load(), "no handler ran on an unreplicated claim")

	require.NoError(t, replica.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		return s.post(c, "/orders", tok, `{"try":9}`).status == http.StatusCreated
	}, 10*time.Second, 50*time.Millisecond, "the released token works once the replica is back")
	require.EqualValues(t, 2, s.execs.Load())
}

// The failover window, reproduced: a claim that the replica never received
// is lost when the primary dies, and the promoted replica lets a retry run
// the handler again. WithReplicaAcks closes the window by refusing to run
// on an unreplicated claim.
func TestFailoverWindow(t *testing.T) {
	for _, acks := range []bool{false, true} {
		t.Run(map[bool]string{false: "asynchronous", true: "with replica acks"}[acks], func(t *testing.T) {
			primary := redistest.Private(t, "--repl-diskless-sync-delay", "0") // sync the replica at once
			// The replica follows the primary through a proxy that can
			// partition them.
			link := redistest.NewProxy(t, primary.Addr())
			host, port, _ := strings.Cut(link.Addr(), ":")
			replica := redistest.Private(t, "--replicaof", host, port)
			rdb := primary.Client(t)
			awaitReplica(t, rdb)
			var opts []Option
			if acks {
				opts = append(opts, WithReplicaAcks(1, 100*time.Millisecond))
			}
			before := newShopOn(t, rdb, opts...)
			c := before.client()

			link.StartBlackhole() // the claim reaches only the primary
			first := before.post(c, "/payments", "pay-1", `{}`)
			// The primary dies, and the replica is promoted.
			require.NoError(t, primary.Signal(syscall.SIGKILL))
			promoted := replica.Client(t)
			require.NoError(t, promoted.SlaveOf(context.Background(), "NO", "ONE").Err())

			after := newShopOn(t, promoted, opts[:0]...)
			retry := after.post(c, "/payments", "pay-1", `{}`)
			require.Equal(t, http.StatusCreated, retry.status)
			runs := before.execs.Load() + after.execs.Load()
			if acks {
				requireProblem(t, first, http.StatusServiceUnavailable, "store-unavailable")
				require.EqualValues(t, 1, runs, "the unreplicated claim never ran")
			} else {
				require.Equal(t, http.StatusCreated, first.status)
				require.EqualValues(t, 2, runs, "the promoted replica never saw the claim")
			}
			t.Logf("replica partitioned, primary killed, replica promoted: %d executions of one key", runs)
		})
	}
}

// isWait picks the WAIT command.
func isWait(cmd redis.Cmder) bool { return cmd.Name() == "wait" }

// primaryWithReplica starts a primary and a replica of it, and returns once
// the replica acknowledges writes.
func primaryWithReplica(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Private(t, "--repl-diskless-sync-delay", "0") // sync the replica at once
	_, port, _ := strings.Cut(primary.Addr(), ":")
	replica = redistest.Private(t, "--replicaof", "127.0.0.1", port)
	awaitReplica(t, primary.Client(t))
	return primary, replica
}

// The lease is renewed while the claim waits for replicas: a wait that
// outlasts the first lease leaves the key with its owner, and a duplicate
// on another instance waits for the answer instead of finding the claim
// abandoned and running the handler again.
func TestLeaseHoldsDuringReplicaWait(t *testing.T) {
	primary, _ := primaryWithReplica(t)
	slow := primary.Client(t)
	waiting := make(chan struct{}, 1)
	slow.AddHook(beforeCommand{isWait, signalThenSleep(waiting, 500*time.Millisecond)})

	opts := []Option{WithKeyPrefix("wait"), WithLockLease(300 * time.Millisecond),
		WithReplicaAcks(1, 250*time.Millisecond), WithStoreTimeout(2 * time.Second), WithRetryAbandoned()}
	a := newShopOn(t, slow, opts...)
	b := newShopOn(t, primary.Client(t), opts...)
	// Past the first lease, inside the WAIT.
	first, dup := duplicateDuringSlowStep(t, a, b, waiting, 350*time.Millisecond)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, first.body, dup.body)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, a.execs.Load()+b.execs.Load())
}

// A lease lost before the handler starts stops it from starting: another
// instance may own the key by then.
func TestLeaseLostBeforeTheHandlerStarts(t *testing.T) {
	primary, _ := primaryWithReplica(t)
	rdb := primary.Client(t)
	s := newShopOn(t, rdb, WithKeyPrefix("stolen"), WithLockLease(300*time.Millisecond),
		WithReplicaAcks(1, 200*time.Millisecond))
	k := clientKeys("stolen", paymentID("stolen"))
	thief := primary.Client(t)
	rdb.AddHook(beforeCommand{isWait, func(ctx context.Context) {
		// The lease lapsed and another instance took the lock (a lock that
		// merely vanished, under a record that still names this run, is
		// taken back: nobody else can run the key then).
		thief.Set(ctx, k.lock, "another-instance", time.Minute)
		// The watchdog renews, and finds the lock gone. A whole lease, so
		// that a watchdog late on a loaded machine changes nothing: by then
		// the lease has run out by the clock as well.
		time.Sleep(300 * time.Millisecond)
	}})
	a := s.post(s.client(), "/payments", "stolen", `{}`)
	requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
	require.Zero(t, s.execs.Load(), "the handler never started without its lease")
}

// New refuses WithReplicaAcks on a client whose claim WAIT cannot follow,
// instead of answering every request 503.
func TestReplicaAcksRefuseARing(t *testing.T) {
	srv := redistest.Private(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": srv.Addr()}})
	t.Cleanup(func() { ring.Close() })
	require.PanicsWithValue(t, "idempotency: WithReplicaAcks needs a *redis.Client (plain or Sentinel) "+
		"or a *redis.ClusterClient, not *redis.Ring", func() { New(ring, WithReplicaAcks(1, time.Second)) })
	require.NotPanics(t, func() { New(ring) })
}

// ackingMasters returns the 3 masters of rdb's cluster once each one's
// replica acknowledges writes.
func ackingMasters(t *testing.T, rdb *redis.ClusterClient) []*redis.Client {
	t.Helper()
	ctx := t.Context()
	var masters []*redis.Client
	require.Eventually(t, func() bool {
		masters = masters[:0]
		var mu sync.Mutex
		err := rdb.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			masters = append(masters, m)
			return nil
		})
		return err == nil && len(masters) == 3
	}, 10*time.Second, 50*time.Millisecond)
	for _, m := range masters {
		conn := m.Conn()
		require.Eventually(t, func() bool { return conn.Wait(ctx, 1, 100*time.Millisecond).Val() == 1 },
			10*time.Second, 20*time.Millisecond, "every master's replica acknowledges")
		conn.Close()
	}
	return masters
}

// WithReplicaAcks on a Cluster follows a reshard. A stored key whose slot
// is migrating is replayed: its claim meets TRYAGAIN while its record and
// its lock are not together on one master (the record on the old one, or
// moved to the new one where no lock exists), and waits; once the slot has
// moved it is answered, and so it is from an instance whose slot map is
// from before the move (MOVED). The key ran once. Without following them,
// both answered 503.
func TestReplicaAcksFollowAReshard(t *testing.T) {
	addrs := redistest.PrivateCluster(t, 3, 1)
	ctx := t.Context()
	cluster := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	rdb := cluster()
	masters := ackingMasters(t, rdb)

	opts := []Option{WithKeyPrefix("reshard"), WithReplicaAcks(1, 500*time.Millisecond)}
	first := newShopOn(t, rdb, opts...)
	c := first.client()
	stored := first.post(c, "/payments", "moving", `{}`)
	require.Equal(t, http.StatusCreated, stored.status, stored.body)
	// An instance whose slot map stays as it is now, before the move: its
	// claims go to the old master and meet MOVED.
	before, err := rdb.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	stale := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return before, nil }})
	t.Cleanup(func() { stale.Close() })
	behind := newShopOn(t, stale, opts...)

	k := clientKeys("reshard", paymentID("moving"))
	slot := int(rdb.ClusterKeySlot(ctx, k.record).Val())
	source, err := rdb.MasterForKey(ctx, k.record)
	require.NoError(t, err)
	target := masters[0]
	if target.Options().Addr == source.Options().Addr {
		target = masters[1]
	}
	id := func(m *redis.Client) string { return m.Do(ctx, "CLUSTER", "MYID").Val().(string) }
	sourceID, targetID := id(source), id(target)

	// The slot starts to move. A retry's claim names the record, still on
	// the old master, and the lock, on neither: TRYAGAIN; once the record
	// has moved, the old master answers ASK, and the new one TRYAGAIN while
	// the slot is importing, since the lock is on neither.
	require.NoError(t, target.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err())
	require.NoError(t, source.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err())
	during := newShopOn(t, rdb, append(opts, WithStoreTimeout(5*time.Second))...)
	retried := during.postAsync(c, "/payments", "moving", `{}`)
	notYet := func(when string) {
		time.Sleep(100 * time.Millisecond) // the claim meets TRYAGAIN meanwhile
		select {
		case early := <-retried:
			t.Fatalf("the retry was answered %s: %+v", when, early)
		default:
		}
	}
	notYet("before its record moved")
	keys, err := source.ClusterGetKeysInSlot(ctx, slot, 100).Result()
	require.NoError(t, err)
	require.Contains(t, keys, k.record)
	host, port, _ := strings.Cut(target.Options().Addr, ":")
	migrate := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, key := range keys {
		migrate = append(migrate, key)
	}
	require.NoError(t, source.Do(ctx, migrate...).Err())
	notYet("while its slot was importing")

	// The slot has moved.
	for _, m := range masters {
		require.NoError(t, m.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err())
	}
	retry := (<-retried).must(t)
	require.Equal(t, http.StatusCreated, retry.status, retry.body)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader), "replayed once its slot moved")
	require.Equal(t, stored.body, retry.body)
	after := behind.post(c, "/payments", "moving", `{}`)
	require.Equal(t, http.StatusCreated, after.status, after.body)
	require.Equal(t, "true", after.header.Get(ReplayedHeader), "replayed once the slot has moved")
	require.EqualValues(t, 1, first.execs.Load()+during.execs.Load()+behind.execs.Load())
}
