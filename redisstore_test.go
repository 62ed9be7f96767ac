package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestRoundTripBudget(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	a := newShopOn(t, rdb)
	b := newShopOn(t, rdb) // a second instance: nothing of a's in its memory
	c := a.client()
	a.post(c, "/orders", a.token(c), `{}`) // loads the scripts into the server

	// Round trips, counted on the client: a command alone is one, and so
	// would be a pipeline. MONITOR lists what reached the server.
	trips := &roundTrips{}
	rdb.AddHook(trips)
	mon := redistest.StartMonitor(t, srv.Addr())
	commands := map[string][]string{}
	measure := func(step func()) int {
		var n int
		cmds := mon.Count(t, rdb, func() {
			before := trips.n.Load()
			step()
			n = int(trips.n.Load() - before)
		})
		t.Logf("%d round trips: %v", n, cmds)
		commands[fmt.Sprint(len(commands))] = cmds
		return n
	}
	var tok string
	issuance := measure(func() { tok = a.token(c) })
	first := measure(func() { require.Equal(t, 201, a.post(c, "/orders", tok, `{}`).status) })
	firstCommands := commands["1"]
	dupOther := measure(func() { require.Equal(t, "true", b.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader)) })
	dupOtherCommands := commands["2"]
	dupSame := measure(func() { require.Equal(t, "true", a.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader)) })
	keyFirst := measure(func() { require.Equal(t, 201, a.post(c, "/payments", "k-1", `{}`).status) })
	keyDup := measure(func() { require.Equal(t, "true", b.post(c, "/payments", "k-1", `{}`).header.Get(ReplayedHeader)) })
	rejected := measure(func() { a.post(c, "/orders", "", `{}`) })

	// Ten duplicates that arrive on the same instance while the first runs
	// wait in memory: the whole burst costs what the first costs.
	release := make(chan struct{})
	a.handler = func(w http.ResponseWriter, r *http.Request) { <-release; a.defaultHandler(w, r) }
	burst := measure(func() {
		answers := make([]<-chan asyncAnswer, 11)
		for i := range answers {
			answers[i] = a.postAsync(c, "/payments", "burst", `{}`)
		}
		require.Eventually(t, func() bool { return a.execs.Load() == 4 }, 5*time.Second, time.Millisecond)
		time.Sleep(50 * time.Millisecond) // let the duplicates queue up
		close(release)
		for _, ans := range answers {
			require.Equal(t, 201, (<-ans).must(t).status)
		}
	})
	require.EqualValues(t, 4, a.execs.Load()+b.execs.Load())

	t.Logf("Redis round trips: issuance %d, first execution %d (key mode %d), duplicate on another instance %d (key mode %d), on the same instance %d, rejected %d, first + 10 concurrent duplicates on one instance %d",
		issuance, first, keyFirst, dupOther, keyDup, dupSame, rejected, burst)
	require.Zero(t, issuance, "a token is signed, not stored")
	require.LessOrEqual(t, first, 2, "the claim, which takes the lock, then the answer's store")
	require.LessOrEqual(t, keyFirst, 2)
	require.LessOrEqual(t, dupOther, 1, "the claim, which finds the answer")
	require.LessOrEqual(t, keyDup, 1)
	require.Zero(t, rejected)
	require.Zero(t, dupSame, "answered from the in-process cache")
	require.LessOrEqual(t, burst, 2)
	// Two commands for a first execution, one for a duplicate on another
	// instance: the claim takes the lock itself, and a token's claim reads
	// no secret.
	require.Equal(t, []string{"evalsha", "evalsha"}, firstCommands)
	require.Equal(t, []string{"evalsha"}, dupOtherCommands)
}

// roundTrips counts a client's round trips: each command sent alone, and
// each pipeline, since its commands go out and come back together.
type roundTrips struct{ n atomic.Int64 }

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}

// resendHook runs every script twice and returns the second reply, as
// go-redis does when the reply to the first was lost on the way back.
type resendHook struct{}

func (resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func TestResentScriptsNeverRunTwice(t *testing.T) {
	prefix := "test-" + t.Name()
	rdb := redistest.Client(t, prefix).(*redis.Client)
	rdb.AddHook(resendHook{})
	s := newShopOn(t, rdb, WithKeyPrefix(prefix))
	c := s.client()

	tok := s.token(c)
	first := s.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	dup := s.post(c, "/orders", tok, `{}`)
	require.Equal(t, first.body, dup.body)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())

	// A released claim, resent, still gives the token back exactly once.
	tok = s.token(c)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if s.execs.Load() == 2 {
			panic("boom")
		}
		s.defaultHandler(w, r)
	}
	h := s.idem.Protect(http.HandlerFunc(s.count))
	require.Panics(t, func() { h.ServeHTTP(discard{}, httpRequest(t, s, c, tok)) })
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	require.Equal(t, "true", s.post(c, "/orders", tok, `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 3, s.execs.Load())
}

// takingOverLease is the lease of takingOverPair's instances. A renewal
// is due every third of a lease, and a stall of the machine past the rest
// of it loses the lease: 1 s leaves room for the stalls of a loaded
// machine under the race detector (300 ms did not).
const takingOverLease = time.Second

// takingOverPair is two instances of one deployment that take abandoned
// keys over (WithRetryAbandoned), so that a lost lease shows as a second
// execution, on a lease of takingOverLease.
func takingOverPair(t *testing.T) (a, b *shop) {
	prefix := "test-" + t.Name()
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(takingOverLease), WithRetryAbandoned()}
	return newShopOn(t, redistest.Client(t, prefix), opts...), newShopOn(t, redistest.Client(t, prefix), opts...)
}

func TestWatchdogKeepsLockForSlowHandler(t *testing.T) {
	const lease = takingOverLease
	a, b := takingOverPair(t)
	slow := func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(4 * lease)
		a.defaultHandler(w, r)
	}
	a.handler, b.handler = slow, slow
	c := a.client()
	done := a.postAsync(c, "/payments", "slow", `{}`)
	require.Eventually(t, func() bool { return a.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(2*lease + lease/3) // past two leases
	dup := b.post(c, "/payments", "slow", `{}`)
	first := (<-done).must(t)
	require.Equal(t, first.body, dup.body)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, a.execs.Load()+b.execs.Load())
}

// crashAfterClaim leaves a claimed key behind as an instance that died (or
// paused) mid-handler would: nothing renews the lock, and no response is
// stored. It returns once the lease has run out, with the dead executor's
// lock value and claim.
func crashAfterClaim(t *testing.T, s *shop, k keys, fp string) (string, claim) {
	t.Helper()
	// A deadline of the test's own, which a stall of a loaded machine
	// cannot outlast.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for range 100 {
		lock, err := newTestLock()
		require.NoError(t, err)
		c, err := s.idem.redis.claim(ctx, k, lock.Value(), fp)
		require.NoError(t, err)
		if c.outcome == outcomeHeld {
			continue // the lock of an earlier attempt has not run out yet
		}
		require.Equal(t, outcomeClaimed, c.outcome)
		require.Eventually(t, func() bool { return s.rdb.Exists(ctx, k.lock).Val() == 0 },
			10*time.Second, time.Millisecond, "the lease runs out")
		if !s.idem.cfg.takeover() {
			// and the claim horizon with it: the executor can no longer
			// store. (A takeover does not wait for it.)
			require.NoError(t, redistest.Age(ctx, s.rdb, k.record, time.Hour))
		}
		return lock.Value(), c
	}
	t.Fatal("in 100 attempts no claim ran within its lease")
	return "", claim{}
}

func TestAbandonedExecution(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "retry abandoned"}[retry], func(t *testing.T) {
			opts := []Option{WithLockLease(100 * time.Millisecond)}
			if retry {
				opts = append(opts, WithRetryAbandoned())
			}
			s := newShop(t, opts...)
			req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
			fp := (&config{}).fingerprint(req, []byte(`{}`), true)
			crashAfterClaim(t, s, clientKeys(s.idem.cfg.prefix, paymentID("k")), fp.text())
			a := s.post(s.client(), "/payments", "k", `{}`)
			if retry {
				require.Equal(t, http.StatusCreated, a.status)
				require.EqualValues(t, 1, s.execs.Load())
			} else {
				requireProblem(t, a, http.StatusConflict, "interrupted")
				require.Zero(t, s.execs.Load())
			}
		})
	}
}

// A takeover holds the key's lock as a fresh claim does: a duplicate on
// another instance, sent while the run that took the key over runs, waits
// for its answer instead of taking the key over in turn.
func TestATakeoverTakesTheLock(t *testing.T) {
	const lease = takingOverLease
	a, b := takingOverPair(t)
	proceed := make(chan struct{})
	a.handler = func(w http.ResponseWriter, r *http.Request) {
		<-proceed
		a.defaultHandler(w, r)
	}
	req, _ := http.NewRequest(http.MethodPost, a.srv.URL+"/payments", strings.NewReader(`{}`))
	fp := (&config{}).fingerprint(req, []byte(`{}`), true)
	crashAfterClaim(t, a, clientKeys(a.idem.cfg.prefix, paymentID("k")), fp.text())

	c := a.client()
	first := a.postAsync(c, "/payments", "k", `{}`)
	require.Eventually(t, func() bool { return a.execs.Load() == 1 }, 10*time.Second, time.Millisecond,
		"the retry takes the abandoned key over")
	dup := b.postAsync(c, "/payments", "k", `{}`)
	time.Sleep(lease + lease/2) // the duplicate's claims find the lock held, past a renewal
	close(proceed)
	taken, replayed := (<-first).must(t), (<-dup).must(t)
	require.Equal(t, http.StatusCreated, taken.status, taken.body)
	require.Equal(t, http.StatusCreated, replayed.status, replayed.body)
	require.Equal(t, "true", replayed.header.Get(ReplayedHeader))
	require.Equal(t, taken.body, replayed.body)
	require.EqualValues(t, 1, a.execs.Load()+b.execs.Load())
}

func TestStaleExecutorCannotOverwrite(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond), WithRetryAbandoned())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	stale, _ := crashAfterClaim(t, s, k, "fp") // the stale executor pauses past its lease

	fresh, lock, _ := takeOverFromStale(t, s, k)
	_, err := fresh.completeWith(ctx, k, lock, fingerprintSum{}, 1, &record{status: 201, body: []byte("fresh")}, time.Hour)
	require.NoError(t, err)

	_, err = s.idem.redis.completeWith(ctx, k, stale, fingerprintSum{}, 1, &record{status: 500, body: []byte("stale")}, time.Hour)
	require.ErrorIs(t, err, ErrLockLost)
	a := s.post(s.client(), "/payments", "k", ``)
	require.Equal(t, 422, a.status, "fingerprint differs from the test's claim")
	rec, err := redistest.ReadRecord(ctx, s.rdb, k.record)
	require.NoError(t, err)
	require.Equal(t, "fresh", rec.Body)
}

// The same while the new executor still runs: the stale executor's store
// finds the key another's, writes nothing, and the new executor's answer
// is the key's.
func TestStaleExecutorCannotStoreOverARunningTakeover(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond), WithRetryAbandoned())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	stale, _ := crashAfterClaim(t, s, k, "fp")
	fresh, lock, fence := takeOverFromStale(t, s, k)

	_, err := s.idem.redis.completeWith(ctx, k, stale, fingerprintSum{}, 1, &record{status: 500, body: []byte("stale")}, time.Hour)
	require.ErrorIs(t, err, ErrLockLost)
	state, err := redistest.ReadRecord(ctx, s.rdb, k.record)
	require.NoError(t, err)
	require.Equal(t, "run", state.State, "still the new executor's run")
	_, err = fresh.completeWith(ctx, k, lock, fingerprintSum{}, fence, &record{status: 201, body: []byte("fresh")}, time.Hour)
	require.NoError(t, err)
	rec, err := redistest.ReadRecord(ctx, s.rdb, k.record)
	require.NoError(t, err)
	require.Equal(t, "fresh", rec.Body)
}

// takeOverFromStale has a new executor take k over from a stale one
// whose lease lapsed, and returns its store, lock value and fence. Its
// lease does not run out during the test, however slow the machine: the
// tests are about the stale one's.
func takeOverFromStale(t *testing.T, s *shop, k keys) (*redisStore, string, uint64) {
	fresh := New(s.rdb, WithKeyPrefix(s.idem.cfg.prefix), WithLockLease(time.Minute), WithRetryAbandoned()).redis
	lock, err := newTestLock()
	require.NoError(t, err)
	c, err := fresh.claim(t.Context(), k, lock.Value(), "fp")
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, c.outcome, "the new executor took over")
	return fresh, lock.Value(), c.fence
}

func TestRedisCluster(t *testing.T) {
	prefix := "test-cluster"
	rdb := redistest.Cluster(t, prefix)
	a := newShopOn(t, rdb, WithKeyPrefix(prefix))
	b := newShopOn(t, rdb, WithKeyPrefix(prefix))
	c := a.client()
	// Many scopes and keys, so that every shard serves some of them.
	for i := range 20 {
		tok := a.token(c)
		first := a.post(c, "/orders", tok, `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.Equal(t, first.body, b.post(c, "/orders", tok, `{}`).body)
		key := "pay-" + strconv.Itoa(i)
		require.Equal(t, http.StatusCreated, a.post(c, "/payments", key, `{}`).status)
		require.Equal(t, "true", b.post(c, "/payments", key, `{}`).header.Get(ReplayedHeader))
		c = a.client() // a new session: a new hash tag
	}
	require.EqualValues(t, 40, a.execs.Load()+b.execs.Load())

	// Concurrent duplicates across both instances.
	tok := a.token(c)
	answers := make([]<-chan asyncAnswer, 40)
	for i := range answers {
		answers[i] = []*shop{a, b}[i%2].postAsync(c, "/orders", tok, `{}`)
	}
	for _, ans := range answers {
		(<-ans).must(t)
	}
	require.EqualValues(t, 41, a.execs.Load()+b.execs.Load())

	nodes, err := rdb.ClusterNodes(context.Background()).Result()
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(nodes, "master"), "a 3-master cluster")
}

func TestFencingTokensGrowWithEveryExecution(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond), WithRetryAbandoned())
	require.Zero(t, FencingToken(context.Background()), "no token outside a protected execution")
	var seen []uint64
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, FencingToken(r.Context()))
		w.WriteHeader(http.StatusCreated)
	}
	c := s.client()
	s.post(c, "/payments", "a", `{}`)
	s.post(c, "/payments", "b", `{}`)

	// A key whose first executor vanished: the retry's token is higher.
	k := clientKeys(s.idem.cfg.prefix, paymentID("c"))
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
	fp := (&config{}).fingerprint(req, []byte(`{}`), true)
	_, crashed := crashAfterClaim(t, s, k, fp.text())
	s.post(c, "/payments", "c", `{}`)

	require.Len(t, seen, 3)
	require.Less(t, seen[0], seen[1], "later claims carry higher tokens")
	require.Less(t, crashed.fence, seen[2], "a takeover outranks the vanished executor")
}

func TestCrossInstanceWaiterWakesOnReleaseWithoutPolling(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	a, b := newShopOn(t, rdb), newShopOn(t, rdb)
	release := make(chan struct{})
	c := a.client()
	a.post(c, "/payments", "warm-up", `{}`) // loads the scripts
	a.handler = func(w http.ResponseWriter, r *http.Request) { <-release; a.defaultHandler(w, r) }

	firstDone := a.postAsync(c, "/payments", "slow", `{}`)
	require.Eventually(t, func() bool { return a.execs.Load() == 2 }, 5*time.Second, time.Millisecond)

	mon := redistest.StartMonitor(t, srv.Addr())
	var dup answer
	var woke time.Duration
	cmds := mon.Count(t, rdb, func() {
		dupDone := b.postAsync(c, "/payments", "slow", `{}`)
		time.Sleep(time.Second) // b waits on a's lock all this time
		released := time.Now()
		close(release)
		dup = (<-dupDone).must(t)
		woke = time.Since(released)
	})
	(<-firstDone).must(t)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.EqualValues(t, 2, a.execs.Load()+b.execs.Load())
	evals := 0
	for _, cmd := range cmds {
		if cmd == "evalsha" || cmd == "eval" {
			evals++
		}
	}
	t.Logf("a 1 s wait on another instance cost %d commands (%d scripts: %v); the waiter answered %v after the release",
		len(cmds), evals, cmds, woke)
	// A 2 ms..50 ms poll would have sent over 20 attempts in that second,
	// each a claim.
	require.LessOrEqual(t, evals, 30)
}

// TestRedisMemoryPerEntry measures, with MEMORY USAGE, what one stored
// record (1 KiB body) occupies in Redis, for the README's sizing. An issued
// token occupies nothing until it is spent.
func TestRedisMemoryPerEntry(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	s := newShopOn(t, rdb)
	body := strings.Repeat("x", 1024)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(body))
	}
	ctx := t.Context()
	usage := func(key string) int64 {
		n, err := rdb.MemoryUsage(ctx, key, 0).Result() // 0: every field, not a sample
		require.NoError(t, err)
		return n
	}
	require.Equal(t, http.StatusCreated, s.post(s.client(), "/payments", "mem", `{"amount":1}`).status)
	rec := usage(clientKeys("idem", paymentID("mem")).record)

	t.Logf("Redis memory (MEMORY USAGE): a stored record with a 1 KiB body %d B; an issued token 0 B", rec)
	require.Less(t, rec, int64(1024+1024), "the body is stored as it is: no base64, no JSON")
}

// A claim resent after it answered "abandoned" answers "abandoned" again.
func TestResentClaimAfterAbandoned(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	k := clientKeys(s.idem.cfg.prefix, paymentID("resend"))
	crashAfterClaim(t, s, k, "fp")
	time.Sleep(150 * time.Millisecond)
	ctx := t.Context()
	lock, err := newTestLock()
	require.NoError(t, err)
	for range 2 {
		cl, err := s.idem.redis.claim(ctx, k, lock.Value(), "fp")
		require.NoError(t, err)
		require.Equal(t, outcomeAbandoned, cl.outcome)
	}
	require.Zero(t, s.rdb.Exists(ctx, k.lock).Val(), "the lock was let go")
}

// A Redis that lost its scripts (a restart, a failover to a replica that
// never loaded them, SCRIPT FLUSH) answers NOSCRIPT to the claim, or to the
// completion when only the claim's script was loaded again. Each is sent
// again whole: the first request runs once and its duplicate on another
// instance is replayed.
func TestScriptsFlushedBetweenRequests(t *testing.T) {
	prefix := "test-" + t.Name()
	rdb := redistest.Client(t, prefix)
	a := newShopOn(t, rdb, WithKeyPrefix(prefix))
	b := newShopOn(t, redistest.Client(t, prefix), WithKeyPrefix(prefix))
	require.Equal(t, http.StatusCreated, a.post(a.client(), "/payments", "warm", `{}`).status)
	for _, claimLoaded := range []bool{false, true} {
		key := fmt.Sprint("after-flush-", claimLoaded)
		require.NoError(t, rdb.ScriptFlush(t.Context()).Err())
		if claimLoaded { // the completion's script is missing, the claim's is not
			require.NoError(t, claimScript.Load(t.Context(), rdb).Err())
		}
		first := a.post(a.client(), "/payments", key, `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.NoError(t, rdb.ScriptFlush(t.Context()).Err())
		dup := b.post(b.client(), "/payments", key, `{}`)
		require.Equal(t, http.StatusCreated, dup.status, dup.body)
		require.Equal(t, "true", dup.header.Get(ReplayedHeader))
		require.Equal(t, first.body, dup.body)
	}
	require.EqualValues(t, 3, a.execs.Load())
	require.Zero(t, b.execs.Load())
}

// A Redis that stops answering (SIGSTOP: connections stay open, replies
// never come) fails requests closed within the store timeout, never runs
// the handler, and serves again once it resumes.
func TestStalledRedisFailsClosedWithinStoreTimeout(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	const storeTimeout = 200 * time.Millisecond
	s := newShopOn(t, rdb, WithStoreTimeout(storeTimeout))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "before", `{}`).status)

	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	var slowest time.Duration
	for i := range 5 {
		start := time.Now()
		a := s.post(c, "/payments", "during-"+string(rune('a'+i)), `{}`)
		slowest = max(slowest, time.Since(start))
		requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
		require.Equal(t, "1", a.header.Get("Retry-After"))
	}
	require.EqualValues(t, 1, s.execs.Load(), "nothing ran while Redis was stalled")
	// go-redis's own ReadTimeout is 3 s: answering well inside it shows that
	// the store timeout, not the client's default, bounds a stalled step.
	require.Less(t, slowest, 3*time.Second)
	t.Logf("stalled Redis: slowest 503 after %v (store timeout %v)", slowest, storeTimeout)

	require.NoError(t, srv.Signal(syscall.SIGCONT))
	resumed = true
	require.Eventually(t, func() bool {
		return s.post(c, "/payments", "after", `{}`).status == http.StatusCreated
	}, 5*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 2, s.execs.Load())
}

// completeWith is complete with plain values, for tests that store as
// some executor would without holding its lease.
func (s *redisStore) completeWith(ctx context.Context, k keys, lockValue string, fp fingerprintSum, fence uint64, rec *record, ttl time.Duration) (completion, error) {
	return s.complete(ctx, k, &lockValue, fp.text(), fence, rec, ttl)
}
