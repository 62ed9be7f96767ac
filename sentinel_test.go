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

// A failover under Sentinel, through go-redis's FailoverClient, of two
// kinds. Killed: the primary is killed with SIGKILL mid-traffic, Sentinel
// promotes the replica, a supervisor restarts the dead server as the new
// primary's replica. Planned: an operator's SENTINEL FAILOVER; the old
// primary stays up and takes writes until the clients switch, then
// Sentinel makes it the new primary's replica, which wipes what it took
// meanwhile. Either way the traffic goes on. With WithReplicaAcks no key
// runs twice, and every answer stored before the failover is replayed
// after it. Without, a claim that the old primary acknowledged and the new
// one never got is lost, and a retry of its key runs again: the test counts
// how often that happened ([docs/redis.md#sentinel]).
func TestSentinelFailover(t *testing.T) {
	for _, tc := range []struct {
		name          string
		planned, acks bool
	}{
		{"killed/with replica acks", false, true},
		{"killed/asynchronous", false, false},
		{"planned/with replica acks", true, true},
		{"planned/asynchronous", true, false},
	} {
		acks := tc.acks
		t.Run(tc.name, func(t *testing.T) {
			set := redistest.Sentinel(t)
			rdb := set.Client(t)
			sentinel := redis.NewClient(&redis.Options{Addr: set.Sentinels[0].Addr()})
			server, _ := redistest.Version(t.Context(), rdb)
			sv, _ := redistest.Version(t.Context(), sentinel)
			sentinel.Close()
			t.Logf("primary and replica: %s; Sentinels: %s", server, sv)
			// The kill makes stores fail and retry in the background; they are
			// expected, and not worth a log line each.
			opts := []Option{WithKeyPrefix("sentinel"), WithLogger(slog.New(slog.DiscardHandler)),
				WithScope(func(*http.Request) (string, error) { return "sentinel", nil })}
			if acks {
				opts = append(opts, WithReplicaAcks(1, 500*time.Millisecond))
			}
			f := newFailoverTraffic(t, rdb, opts)
			callers := 8
			if tc.planned && !acks {
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
			checkpointed := f.checkpoint(set.Primary)

			// Mid-traffic, the primary dies, or the operator fails over.
			old := set.Primary.Addr()
			inFlight := f.inFlight()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if tc.planned {
				s := redis.NewClient(&redis.Options{Addr: set.Sentinels[0].Addr()})
				require.NoError(t, s.Do(ctx, "SENTINEL", "FAILOVER", set.Name).Err())
				s.Close()
			} else {
				require.NoError(t, set.Primary.Signal(syscall.SIGKILL))
			}
			began := time.Now()
			promoted, err := set.AwaitFailover(ctx, old)
			require.NoError(t, err)
			took := time.Since(began)
			if !tc.planned {
				// The supervisor restarts the dead server, as a replica of
				// the new primary: WithReplicaAcks needs one again. (Sentinel
				// demotes a primary that a planned failover left up itself.)
				redistest.RestartAsReplica(t, set.Primary, promoted)
			}
			after := f.completed()
			require.Eventually(t, func() bool { return f.completed() >= after+40 }, 45*time.Second, 10*time.Millisecond,
				"traffic flows on the promoted primary")
			flowing := time.Since(began)
			f.stop()

			// Every answer, asked again through a fresh instance (no
			// response cache) on the promoted primary.
			again := newShopOn(t, rdb, opts...)
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
				case !acks && a.status == http.StatusCreated:
					// Ran again: counted below.
				default:
					t.Fatalf("key %s (checkpointed %v): %d %s", key, checkpointed[key], a.status, a.body)
				}
			}
			twice := f.ranTwice()
			t.Logf("%s: Sentinel named the new primary %v after the failover began, 40 more keys answered by %v; "+
				"%d keys answered, %d of them checkpointed before the failover, "+
				"%d in flight then; asked again after the failover: %d replayed, %d interrupted or in progress "+
				"(claimed, answer not replicated); %d ran twice %v", tc.name,
				took.Round(10*time.Millisecond), flowing.Round(10*time.Millisecond), len(f.answers), len(checkpointed),
				len(inFlight), replayed, interrupted, len(twice), twice[:min(len(twice), 10)])
			for key := range checkpointed {
				require.Contains(t, f.answers, key)
			}
			if acks {
				require.Empty(t, twice, "with replica acks no key runs twice")
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

// checkpoint makes sure that the replica has the stored answer of every
// key answered so far: it waits until each record is stored on the
// primary, then writes and waits for the replica to acknowledge that write,
// which the replication stream carries after them. It returns those keys.
func (f *failoverTraffic) checkpoint(primary *redistest.Server) map[string]bool {
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
	require.EqualValues(f.t, 1, c.Wait(ctx, 1, 5*time.Second).Val(), "the replica acknowledges the checkpoint")
	return keys
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
