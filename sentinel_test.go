package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A failover under Sentinel, through go-redis's FailoverClient, of three
// kinds. Killed: the primary is killed with SIGKILL mid-traffic, Sentinel
// promotes a replica, and with one replica a supervisor restarts the dead
// server as the new primary's replica. Planned: an operator's SENTINEL
// FAILOVER; the old primary stays up and takes writes until the clients
// switch, then Sentinel makes it the new primary's replica, which wipes
// what it took meanwhile. Split: the network between the primary and the
// Sentinels and replicas is cut; the callers, on the primary's side, keep
// writing to it until the Sentinels tell them of the new primary; then the
// network heals, and Sentinel makes the old primary a replica, as after a
// planned failover. Either way the traffic goes on, and every answer
// stored before the failover is replayed after it. A claim that the old
// primary acknowledged and the new one never got is lost, and a retry of
// its key runs again. WithReplicaAcks rules that out where no replica but
// the promoted one can acknowledge the old primary's claims (once, below);
// elsewhere the test counts how often it happened, and in every case how
// long requests were refused 503 ([docs/redis.md#sentinel]).
func TestSentinelFailover(t *testing.T) {
	const (
		killed = iota
		planned
		split
	)
	for _, tc := range []struct {
		name     string
		failover int
		replicas int
		acks     int // WithReplicaAcks(acks, 500ms); 0: without
		// once: no key runs twice. A claim that only a replica which is
		// not promoted acknowledged is lost: with two replicas and one
		// acknowledgement, a planned failover leaves the old primary a
		// replica that acknowledges it until Sentinel turns that replica to
		// the new primary, which wipes what it took; and a primary killed
		// leaves such claims within the lag between the two replicas.
		once bool
		// measure: the case only measures, for docs/redis.md, and runs
		// with -long alone, to keep the test command short.
		measure bool
		// behind: how many replicas a split leaves on the primary's side.
		behind int
	}{
		{"killed/with replica acks", killed, 1, 1, true, false, 0},
		{"killed/asynchronous", killed, 1, 0, false, false, 0},
		{"killed/two replicas/with replica acks", killed, 2, 1, false, true, 0},
		{"killed/two replicas/with two replica acks", killed, 2, 2, true, true, 0},
		{"planned/with replica acks", planned, 1, 1, true, false, 0},
		{"planned/asynchronous", planned, 1, 0, false, false, 0},
		{"planned/two replicas/with replica acks", planned, 2, 1, false, true, 0},
		{"planned/two replicas/with two replica acks", planned, 2, 2, true, false, 0},
		// Every replica is on the Sentinels' side of the split.
		{"split/with replica acks", split, 1, 1, true, true, 0},
		{"split/two replicas/with replica acks", split, 2, 1, true, false, 0},
		{"split/two replicas/asynchronous", split, 2, 0, false, true, 0},
		// One replica stays with the primary, and acknowledges its claims
		// until Sentinel turns it to the new primary once the split heals.
		{"split/two replicas, one left behind/with replica acks", split, 2, 1, false, true, 1},
		{"split/two replicas, one left behind/with two replica acks", split, 2, 2, true, true, 1},
	} {
		acks := tc.acks > 0
		t.Run(tc.name, func(t *testing.T) {
			if tc.measure && !*long {
				t.Skip("a measurement for docs/redis.md, which asserts nothing the other cases do not: run with -long")
			}
			set := redistest.SentinelWith(t, redistest.SentinelOptions{Replicas: tc.replicas,
				Splittable: tc.failover == split, LeftBehind: tc.behind})
			rdb := set.PrimarySideClient(t)
			sentinel := redis.NewClient(&redis.Options{Addr: set.Sentinels[0].Addr()})
			server, _ := redistest.Version(t.Context(), rdb)
			sv, _ := redistest.Version(t.Context(), sentinel)
			sentinel.Close()
			t.Logf("primary and %d replicas: %s; Sentinels: %s", tc.replicas, server, sv)
			// The kill makes stores fail and retry in the background; they are
			// expected, and not worth a log line each.
			opts := []Option{WithKeyPrefix("sentinel"), WithLogger(slog.New(slog.DiscardHandler)),
				WithScope(func(*http.Request) (string, error) { return "sentinel", nil })}
			if acks {
				opts = append(opts, WithReplicaAcks(tc.acks, 500*time.Millisecond))
			}
			f := newFailoverTraffic(t, rdb, opts)
			callers := 8
			if tc.failover != killed && !acks {
				// Every key the old primary took after the failover began
				// runs again: fewer callers keep the final pass short.
				callers = 2
			}
			f.start(callers)

			// Some keys complete, and stored answers are checkpointed: a
			// write the replica acknowledges comes after them in the
			// replication stream, so the replica has them all.
			require.Eventually(t, func() bool { return f.completed() >= 40 }, 20*time.Second, 10*time.Millisecond,
				"traffic flows before the kill")
			checkpointed := f.checkpoint(set.Primary, tc.replicas)

			// Mid-traffic, the primary dies, or the operator fails over, or
			// the network splits the primary off.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			old, err := set.Master(ctx) // behind the Link, in a split
			require.NoError(t, err)
			inFlight := f.inFlight()
			began := time.Now()
			switch tc.failover {
			case planned:
				s := redis.NewClient(&redis.Options{Addr: set.Sentinels[0].Addr()})
				require.NoError(t, s.Do(ctx, "SENTINEL", "FAILOVER", set.Name).Err())
				s.Close()
			case killed:
				require.NoError(t, set.Primary.Signal(syscall.SIGKILL))
			case split:
				set.Split()
			}
			promoted, err := set.AwaitFailover(ctx, old)
			require.NoError(t, err)
			took := time.Since(began)
			// The promoted primary has a replica fewer than the set had,
			// and until the split heals none of those left behind.
			short := tc.acks > tc.replicas-1-tc.behind
			if tc.failover == killed && (tc.replicas == 1 || short) {
				// The supervisor restarts the dead server, as a replica of
				// the new primary: WithReplicaAcks needs it again. (Sentinel
				// demotes a primary that a planned failover left up itself,
				// and with two replicas the new primary has one still.)
				redistest.RestartAsReplica(t, set.Primary, promoted)
			}
			demoted := time.Duration(0)
			heal := func() {
				// The network heals; Sentinel makes the old primary a
				// replica of the new one, which wipes what it took while
				// split off.
				healed := time.Now()
				set.Heal()
				old := set.Primary.Client(t)
				require.Eventually(t, func() bool {
					role, err := old.Do(t.Context(), "ROLE").Slice()
					return err == nil && len(role) > 0 && (role[0] == "slave" || role[0] == "replica")
				}, 30*time.Second, 50*time.Millisecond, "Sentinel demotes the old primary once the split heals")
				demoted = time.Since(healed)
			}
			if tc.failover == split && short {
				// No replica acknowledges the new primary's claims until the
				// old primary is its replica: nothing flows before the heal.
				heal()
			}
			after := f.completed()
			require.Eventually(t, func() bool { return f.completed() >= after+40 }, 45*time.Second, 10*time.Millisecond,
				"traffic flows on the promoted primary")
			flowing := time.Since(began)
			f.stop()
			refused, firstRefused, lastRefused := f.refusedSince(began)
			if tc.failover == split && !short {
				heal()
			}

			// Every answer, asked again through a fresh instance (no
			// response cache) on the promoted primary.
			// A key whose claim outlived its answer is in progress: a short
			// wait for it keeps the pass short.
			again := newShopOn(t, rdb, slices.Concat(opts, []Option{WithWaitTimeout(200 * time.Millisecond)})...)
			again.handler = f.handler
			c := again.client()
			replayed, interrupted := 0, 0
			for _, key := range f.keys() {
				first := f.answers[key]
				a := again.post(c, "/payments", key, `{}`)
				switch {
				case a.status == http.StatusCreated && a.header.Get(ReplayedHeader) == "true":
					require.Equal(t, first, a.body, "key %s: the replay is the first answer", key)
					replayed++
				case a.status == http.StatusConflict && !checkpointed[key]:
					// Claimed, its answer lost with the old primary: in
					// progress until the claim horizon, then interrupted.
					require.True(t, strings.Contains(a.body, "#problem-interrupted") ||
						strings.Contains(a.body, "#problem-in-progress"), "key %s: %s", key, a.body)
					interrupted++
				case !tc.once && a.status == http.StatusCreated:
					// Ran again: counted below.
				default:
					t.Fatalf("key %s (checkpointed %v): %d %s", key, checkpointed[key], a.status, a.body)
				}
			}
			twice := f.ranTwice()
			t.Logf("%s: Sentinel named the new primary %v after the failover began, 40 more keys answered by %v; "+
				"%d answers 503, from %v to %v after it began; "+
				"%d keys answered, %d of them checkpointed before the failover, "+
				"%d in flight then; asked again after the failover: %d replayed, %d interrupted or in progress "+
				"(claimed, answer not replicated); %d ran twice %v", tc.name,
				took.Round(10*time.Millisecond), flowing.Round(10*time.Millisecond),
				refused, firstRefused.Round(10*time.Millisecond), lastRefused.Round(10*time.Millisecond),
				len(f.answers), len(checkpointed),
				len(inFlight), replayed, interrupted, len(twice), twice[:min(len(twice), 10)])
			if tc.failover == split {
				t.Logf("%s: the old primary was a replica %v after the split healed", tc.name,
					demoted.Round(10*time.Millisecond))
			}
			for key := range checkpointed {
				require.Contains(t, f.answers, key)
			}
			if tc.once {
				require.Empty(t, twice, "no key runs twice")
			}
			require.Empty(t, f.unexpected(), "every answer was a 201, a 503 or a 409")
		})
	}
}

// failoverTraffic sends POST /payments with a new key per request from
// several callers, each retrying its key until it gets an answer other than
// 503 or 409 in-progress, and counts executions per key.
type failoverTraffic struct {
	t    *testing.T
	shop *shop
	rdb  redis.UniversalClient
	opts []Option

	mu      sync.Mutex
	runs    map[string]int    // executions per key, on every instance
	answers map[string]string // a key's first 201 body
	current map[int]string    // what each caller is sending now
	odd     []string          // answers that are neither 201, 503 nor 409
	refused []time.Time       // when each 503 came
	done    atomic.Int64
	halt    chan struct{}
	wg      sync.WaitGroup
}

func newFailoverTraffic(t *testing.T, rdb redis.UniversalClient, opts []Option) *failoverTraffic {
	f := &failoverTraffic{t: t, rdb: rdb, opts: opts, runs: map[string]int{}, answers: map[string]string{},
		current: map[int]string{}, halt: make(chan struct{})}
	f.shop = newShopOn(t, rdb, opts...)
	f.shop.handler = f.handler
	t.Cleanup(f.stop)
	return f
}

// handler runs a payment that takes a few milliseconds and answers which
// execution of its key this was.
func (f *failoverTraffic) handler(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(KeyHeader)
	f.mu.Lock()
	f.runs[key]++
	n := f.runs[key]
	f.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"execution":%d}`, key, n)
}

func (f *failoverTraffic) start(callers int) {
	for i := range callers {
		f.wg.Add(1)
		go f.caller(i)
	}
}

func (f *failoverTraffic) caller(id int) {
	defer f.wg.Done()
	c := f.shop.client()
	deadline := time.Now().Add(50 * time.Second)
	for n := 0; ; n++ {
		if f.halted() {
			return
		}
		key := fmt.Sprintf("c%d-%d", id, n)
		f.mu.Lock()
		f.current[id] = key
		f.mu.Unlock()
		for time.Now().Before(deadline) && !f.halted() {
			req, _ := http.NewRequest(http.MethodPost, f.shop.srv.URL+"/payments", strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(KeyHeader, key)
			a, err := tryDo(c, req)
			if err == nil && a.status == http.StatusCreated {
				f.mu.Lock()
				if _, ok := f.answers[key]; !ok {
					f.answers[key] = a.body
				}
				f.mu.Unlock()
				f.done.Add(1)
				break
			}
			if err == nil && a.status == http.StatusConflict && strings.Contains(a.body, "#problem-interrupted") {
				break // asked again at the end
			}
			if err == nil && a.status != http.StatusServiceUnavailable && a.status != http.StatusConflict {
				f.mu.Lock()
				f.odd = append(f.odd, fmt.Sprintf("%s: %d %s", key, a.status, a.body))
				f.mu.Unlock()
				break
			}
			if err == nil && a.status == http.StatusServiceUnavailable {
				f.mu.Lock()
				f.refused = append(f.refused, time.Now())
				f.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond) // Redis is failing over
		}
	}
}

func (f *failoverTraffic) stop() {
	if !f.halted() {
		close(f.halt)
	}
	f.wg.Wait()
}

func (f *failoverTraffic) halted() bool {
	select {
	case <-f.halt:
		return true
	default:
		return false
	}
}

func (f *failoverTraffic) completed() int64 { return f.done.Load() }

// inFlight is what the callers are sending now.
func (f *failoverTraffic) inFlight() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	for _, k := range f.current {
		keys = append(keys, k)
	}
	return keys
}

// checkpoint makes sure that every replica has the stored answer of every
// key answered so far: it waits until each record is stored on the
// primary, then writes and waits for the replicas to acknowledge that
// write, which the replication stream carries after them. It returns those
// keys.
func (f *failoverTraffic) checkpoint(primary *redistest.Server, replicas int) map[string]bool {
	f.t.Helper()
	f.mu.Lock()
	keys := map[string]bool{}
	for k := range f.answers {
		keys[k] = true
	}
	f.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: primary.Addr(), PoolSize: 1})
	defer c.Close()
	ctx := f.t.Context()
	for k := range keys {
		record := clientKeys("sentinel", identityOf(false, "sentinel", k)).record
		require.Eventually(f.t, func() bool { return redistest.RecordState(ctx, c, record) == "done" }, 10*time.Second,
			5*time.Millisecond, "key %s is stored", k)
	}
	require.NoError(f.t, c.Set(ctx, "sentinel-checkpoint", "1", time.Minute).Err())
	require.EqualValues(f.t, replicas, c.Wait(ctx, replicas, 5*time.Second).Val(), "the replicas acknowledge the checkpoint")
	return keys
}

// refusedSince counts the 503 answers since t, and says when the first
// and the last came, after t.
func (f *failoverTraffic) refusedSince(t time.Time) (n int, first, last time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, at := range f.refused {
		if at.Before(t) {
			continue
		}
		if n == 0 {
			first = at.Sub(t)
		}
		n++
		last = at.Sub(t)
	}
	return n, first, last
}

// keys are the keys that got a 201, in order.
func (f *failoverTraffic) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	for k := range f.answers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (f *failoverTraffic) ranTwice() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var twice []string
	for k, n := range f.runs {
		if n > 1 {
			twice = append(twice, k)
		}
	}
	slices.Sort(twice)
	return twice
}

func (f *failoverTraffic) unexpected() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.odd)
}

// New on a Sentinel failover client without WithReplicaAcks says what a
// failover can cost, once; on a plain client it says nothing of it.
func TestAFailoverClientWithoutReplicaAcksIsLogged(t *testing.T) {
	logged := func(rdb redis.UniversalClient) string {
		var logs strings.Builder
		New(rdb, WithStoreTimeout(100*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		return logs.String()
	}
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "idempotency",
		SentinelAddrs: []string{"127.0.0.1:1"}, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { failover.Close() })
	require.Equal(t, 1, strings.Count(logged(failover), "without WithReplicaAcks"))
	require.NotContains(t, logged(redistest.Client(t, "test-"+t.Name())), "WithReplicaAcks")
}
