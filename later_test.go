package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// privateShop is a shop on a redis-server of its own, which the test may
// stop and resume.
func privateShop(t *testing.T, opts ...Option) (*shop, *redistest.Server) {
	t.Helper()
	srv := redistest.Private(t)
	return newShopOn(t, srv.Client(t), append([]Option{WithKeyPrefix("p")}, opts...)...), srv
}

// blockedPayments posts n payments, keys k0 to k(n-1), whose handlers
// block until release is called, and returns once every one runs.
func blockedPayments(t *testing.T, s *shop, n int) (answers []<-chan asyncAnswer, release func()) {
	t.Helper()
	stall := make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		<-stall
		s.defaultHandler(w, r)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(stall) }) }
	t.Cleanup(release) // before the server's Close, which waits for the handlers
	c := s.client()
	for i := range n {
		answers = append(answers, s.postAsync(c, "/payments", fmt.Sprint("k", i), `{}`))
	}
	require.Eventually(t, func() bool { return s.execs.Load() == int64(n) }, 30*time.Second, 5*time.Millisecond,
		"every payment runs")
	return answers, release
}

// The answers of handlers that finished while Redis stalled, longer than a
// lease, are stored once Redis answers again: the background keeps trying
// them for as long as a claim reads their keys in progress.
func TestAnswersOutlastAStallLongerThanALease(t *testing.T) {
	s, srv := privateShop(t, WithLockLease(300*time.Millisecond), WithStoreTimeout(500*time.Millisecond),
		WithExecutionTimeout(10*time.Second))
	const n = 20
	answers, release := blockedPayments(t, s, n)
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	release()
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, (<-a).must(t).status)
	}
	time.Sleep(time.Second) // more leases: a queue that gave up after one would have
	require.NoError(t, srv.Signal(syscall.SIGCONT))

	shutdown, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, s.idem.Shutdown(shutdown), "every answer stored")
	for i := range n {
		require.Equal(t, "done", redistest.RecordState(t.Context(), s.rdb, clientKeys("p", paymentID(fmt.Sprint("k", i))).record))
	}
	require.EqualValues(t, n, s.execs.Load())
}

// A graceful shutdown during a Redis blip: the request has its answer, the
// store waits in the background, and Shutdown returns once Redis took it.
// After Shutdown has begun, new requests are refused before they claim;
// another instance replays the answer.
func TestShutdownDrainsAPendingStore(t *testing.T) {
	s, srv := privateShop(t, WithStoreTimeout(100*time.Millisecond))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, srv.Signal(syscall.SIGSTOP)) // the blip begins as the handler answers
		s.defaultHandler(w, r)
	}
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", `{}`).status)
	k := clientKeys("p", paymentID("k"))

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- s.idem.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with the store pending", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	require.NoError(t, <-done)
	require.Equal(t, "done", redistest.RecordState(t.Context(), s.rdb, k.record))

	s.handler = s.defaultHandler
	requireProblem(t, s.post(c, "/payments", "new", `{}`), http.StatusServiceUnavailable, "store-unavailable")
	require.EqualValues(t, 1, s.execs.Load())
	again := newShopOn(t, s.rdb, WithKeyPrefix("p")).post(c, "/payments", "k", `{}`)
	require.Equal(t, "true", again.header.Get(ReplayedHeader), "another instance replays the drained answer")
}

// A drain that runs out of time names the keys it leaves undone, for an
// operator, and says so.
func TestAnUnfinishedShutdownNamesItsKeys(t *testing.T) {
	var logs syncbuf.Buffer
	s, srv := privateShop(t, WithStoreTimeout(100*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, srv.Signal(syscall.SIGSTOP))
		s.defaultHandler(w, r)
	}
	defer srv.Signal(syscall.SIGCONT)
	require.Equal(t, http.StatusCreated, s.post(s.client(), "/payments", "k", `{}`).status)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.idem.Shutdown(ctx), context.DeadlineExceeded)
	require.Contains(t, logs.String(), clientKeys("p", paymentID("k")).record)
}

// A drain that runs out of time while handlers still run names their keys
// too: once the process exits, a retry finds each of them interrupted.
func TestAnUnfinishedShutdownNamesTheKeysStillRunning(t *testing.T) {
	var logs syncbuf.Buffer
	s, _ := privateShop(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	answers, release := blockedPayments(t, s, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.idem.Shutdown(ctx), context.DeadlineExceeded)
	for _, k := range []string{"k0", "k1"} {
		require.Contains(t, logs.String(), clientKeys("p", paymentID(k)).record)
	}
	release()
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, (<-a).status)
	}
}

// A drain whose Redis stalls past the claim horizon: the stored answer and
// the release wait for Redis however long it takes, and Shutdown returns
// only once both are done. Giving them up at the horizon lost the answer
// while Shutdown returned nil before Redis was back, and left the released
// key interrupted.
func TestADrainOutlastsTheClaimHorizon(t *testing.T) {
	s, srv := privateShop(t, WithLockLease(300*time.Millisecond), WithStoreTimeout(100*time.Millisecond),
		WithExecutionTimeout(time.Second))
	running, stall := make(chan struct{}, 2), make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		running <- struct{}{}
		<-stall
		if r.Header.Get(KeyHeader) == "given-up" {
			Release(r.Context())
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		s.defaultHandler(w, r)
	}
	c := s.client()
	stored, givenUp := s.postAsync(c, "/payments", "stored", `{}`), s.postAsync(c, "/payments", "given-up", `{}`)
	<-running
	<-running
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	defer srv.Signal(syscall.SIGCONT)
	close(stall)
	require.Equal(t, http.StatusCreated, (<-stored).must(t).status)
	require.Equal(t, http.StatusUnprocessableEntity, (<-givenUp).must(t).status)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- s.idem.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with Redis stalled", err)
	case <-time.After(s.idem.cfg.claimHorizon() + time.Second):
	}
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	require.NoError(t, <-done)
	require.Equal(t, "done", redistest.RecordState(t.Context(), s.rdb, clientKeys("p", paymentID("stored")).record))
	require.Empty(t, redistest.RecordState(t.Context(), s.rdb, clientKeys("p", paymentID("given-up")).record),
		"released")
}

// While Redis stalls and work waits for it, new requests are refused at
// once, before any handler runs, instead of each waiting out its store
// timeout and leaving work behind: the queue stays bounded and no stored
// answer is dropped.
func TestAnOutageRefusesNewClaimsAtOnce(t *testing.T) {
	s, srv := privateShop(t, WithStoreTimeout(time.Second))
	const n = laterOutage
	answers, release := blockedPayments(t, s, n)
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	release()
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, (<-a).must(t).status)
	}
	require.Eventually(t, func() bool {
		q := s.idem.later
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.failing
	}, 10*time.Second, 10*time.Millisecond)

	start := time.Now()
	refused := s.post(s.client(), "/payments", "new", `{}`)
	requireProblem(t, refused, http.StatusServiceUnavailable, "store-unavailable")
	require.NotEmpty(t, refused.header.Get("Retry-After"))
	require.Less(t, time.Since(start), 800*time.Millisecond, "refused without waiting out the store timeout")
	require.EqualValues(t, n, s.execs.Load(), "the refused request ran nothing")

	require.NoError(t, srv.Signal(syscall.SIGCONT))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, s.idem.Shutdown(ctx))
	for i := range n {
		require.Equal(t, "done", redistest.RecordState(t.Context(), s.rdb, clientKeys("p", paymentID(fmt.Sprint("k", i))).record))
	}
}

// Redis stalls past a short lease while a handler runs, without
// WithRetryAbandoned: the run is alive, and a duplicate is told it is in
// progress (and then gets its answer), never that it was interrupted.
func TestALiveRunIsNeverReportedInterrupted(t *testing.T) {
	s, srv := privateShop(t, WithLockLease(200*time.Millisecond), WithStoreTimeout(100*time.Millisecond),
		WithWaitTimeout(300*time.Millisecond))
	finish := make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, srv.Signal(syscall.SIGSTOP))
		time.Sleep(600 * time.Millisecond) // three leases
		require.NoError(t, srv.Signal(syscall.SIGCONT))
		<-finish
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.postAsync(c, "/payments", "k", `{}`)
	k := clientKeys("p", paymentID("k"))
	require.Eventually(t, func() bool { return s.execs.Load() == 1 && s.rdb.Exists(t.Context(), k.lock).Val() == 0 },
		10*time.Second, 10*time.Millisecond, "the lock lapsed during the stall")

	other := newShopOn(t, s.rdb, WithKeyPrefix("p"), WithWaitTimeout(300*time.Millisecond))
	dup := other.post(other.client(), "/payments", "k", `{}`)
	requireProblem(t, dup, http.StatusConflict, "in-progress")
	require.NotEmpty(t, dup.header.Get("Retry-After"))

	close(finish)
	require.Equal(t, http.StatusCreated, (<-first).must(t).status)
	again := other.post(other.client(), "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
	require.Zero(t, other.execs.Load())
}

// A handler that ignores its context runs on past the execution timeout
// and the claim horizon, and Redis stalled under it long enough for its
// lock to lapse: the run takes its lock back once Redis answers, so a
// duplicate waits for it (409 in-progress) and then replays it, never
// reads it interrupted.
func TestALiveRunTakesItsLapsedLockBack(t *testing.T) {
	s, srv := privateShop(t, WithLockLease(200*time.Millisecond), WithStoreTimeout(100*time.Millisecond),
		WithExecutionTimeout(300*time.Millisecond), WithWaitTimeout(200*time.Millisecond))
	finish := make(chan struct{})
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, srv.Signal(syscall.SIGSTOP))
		time.Sleep(600 * time.Millisecond) // three leases
		require.NoError(t, srv.Signal(syscall.SIGCONT))
		<-finish // past the horizon (1.1 s), its context long cancelled
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.postAsync(c, "/payments", "k", `{}`)
	k := clientKeys("p", paymentID("k"))
	require.Eventually(t, func() bool { return s.execs.Load() == 1 && s.rdb.Exists(t.Context(), k.lock).Val() == 1 },
		10*time.Second, 10*time.Millisecond, "the run took its lock back after the stall")
	time.Sleep(1200 * time.Millisecond) // past the claim horizon

	other := newShopOn(t, s.rdb, WithKeyPrefix("p"), WithWaitTimeout(200*time.Millisecond))
	requireProblem(t, other.post(other.client(), "/payments", "k", `{}`), http.StatusConflict, "in-progress")
	close(finish)
	require.Equal(t, http.StatusCreated, (<-first).must(t).status)
	again := other.post(other.client(), "/payments", "k", `{}`)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
	require.Zero(t, other.execs.Load())
}

// A claim that reached Redis while its reply did not, followed by an outage
// longer than a lease: the undo waits in the background for as long as
// Redis is away, so the key is free once Redis is back, not left
// interrupted although its handler never ran.
func TestAClaimWithoutAReplyIsUndoneHoweverLongRedisIsAway(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	opts := []Option{WithKeyPrefix("undo"), WithCallerCredentials(), WithLockLease(300 * time.Millisecond),
		WithStoreTimeout(300 * time.Millisecond), WithExecutionTimeout(time.Second)}
	h := newCounting(0)
	m := New(clientTo(t, proxy.Addr()), opts...)
	send(m.ProtectKey(h), "warm-up", `{}`)

	proxy.SetDelay(time.Second) // the claim runs; its reply comes too late
	first := send(m.ProtectKey(h), "k", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
	proxy.StartBlackhole() // and then Redis is away for many leases
	proxy.SetDelay(0)
	time.Sleep(1500 * time.Millisecond)
	proxy.EndBlackhole()

	drain, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, m.Shutdown(drain), "the undo is done")
	other := New(srv.Client(t), opts...).ProtectKey(h)
	retry := send(other, "k", `{}`)
	require.Equal(t, http.StatusCreated, retry.Code, "the key is free: %s", retry.Body)
	require.Empty(t, h.doubles())
}

// A job whose Redis client the application closed ends: nothing will ever
// answer it, and its worker must not retry for the process's lifetime.
func TestAJobEndsWhenItsClientIsClosed(t *testing.T) {
	srv := redistest.Private(t)
	var logs syncbuf.Buffer
	rdb := srv.Client(t)
	m := New(rdb, WithKeyPrefix("closed"), WithCallerCredentials(),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	// Redis stops before the job is queued: were it queued first, a busy
	// machine could let its first try reach Redis and succeed.
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	m.later.add(clientKeys("closed", paymentID("k")), "release", 0, time.Time{}, func(ctx context.Context) error {
		return rdb.Ping(ctx).Err()
	})
	rdb.Close()
	drain, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, m.Shutdown(drain), "the job ended")
	require.Contains(t, logs.String(), "the Redis client was closed")
}

// While the store does not answer, the queue of work owed to it tries one
// job at a time, once a pause that grows with each failure is over: a store
// on its way back (or a database whose queue of new connections a storm of
// retries would keep full) meets one try per pause from each process, not
// one per job. Once a try succeeds, every job is done.
func TestAFailingStoreIsTriedByOneJobAtATime(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	m := New(clientTo(t, proxy.Addr()), WithKeyPrefix("probe"), WithStoreTimeout(100*time.Millisecond))
	const jobs = 40
	var claimed []*lease
	for i := range jobs {
		c := &call{ctx: t.Context(), key: fmt.Sprint("k", i)}
		c.id = identityOfKind('f', "", c.key)
		l := &lease{m: m, k: m.redisKeys(c), lockValue: newLockValue()}
		cl, err := m.redis.claim(t.Context(), l.k, l.lockValue, "fp")
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, cl.outcome)
		claimed = append(claimed, l)
	}
	proxy.StartBlackhole()
	for _, l := range claimed {
		l.releaseLater()
	}
	time.Sleep(time.Second) // every worker's first try has failed
	before := proxy.Unheard()
	const outage = 3 * time.Second
	time.Sleep(outage)
	tries := proxy.Unheard() - before
	proxy.EndBlackhole()
	t.Logf("%d jobs queued; %d tries reached the proxy in %v of outage", jobs, tries, outage)
	// One try per 600 ms (the longest pause and the store timeout) is 5;
	// a try per job and pause would be over 150.
	require.Less(t, tries, int64(20), "tries during the outage")
	healed, direct := time.Now(), srv.Client(t)
	require.Eventually(t, func() bool {
		for _, l := range claimed {
			if direct.Exists(t.Context(), l.k.record).Val() == 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "every claim undone once the store answers")
	t.Logf("every claim undone %v after the store answered again", time.Since(healed).Round(time.Millisecond))
}
