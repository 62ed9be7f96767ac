package idempotency

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// functionKeys are the Redis keys of Do's key id in the empty scope.
func functionKeys(m *Middleware, id string) keys {
	c := &call{key: id}
	c.id = identityOfKind('f', "", id)
	return m.redisKeys(c)
}

// A reverse proxy whose upstream dies in the middle of the body aborts
// with http.ErrAbortHandler after the status went out: the upstream has
// run, so the key is kept, and a retry is answered 409 interrupted instead
// of running the upstream a second time.
func TestPanicAfterTheStatusKeepsTheKey(t *testing.T) {
	var upstreamRuns atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamRuns.Add(1)
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charged":`)
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the upstream dies mid-body
		}
	}))
	t.Cleanup(upstream.Close)
	target, err := url.Parse(upstream.URL)
	require.NoError(t, err)

	s := newShop(t)
	proxy := s.idem.ProtectKey(httputil.NewSingleHostReverseProxy(target))
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)

	post := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "proxied")
		return http.DefaultClient.Do(req)
	}
	if resp, err := post(); err == nil { // the client sees the body cut short
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := post()
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	requireProblem(t, answer{status: resp.StatusCode, header: resp.Header, body: string(body)},
		http.StatusConflict, "interrupted")
	require.EqualValues(t, 1, upstreamRuns.Load(), "the upstream ran once")
}

// Do keeps the key when the execution timeout cut the function off, and
// says why: the function may have taken effect before it noticed.
func TestDoCutOffByTheExecutionTimeoutKeepsTheKey(t *testing.T) {
	m, other := twoInstances(t, WithExecutionTimeout(200*time.Millisecond))
	var effects atomic.Int64
	fn := func(ctx context.Context) (string, error) {
		effects.Add(1)
		<-ctx.Done()
		return "", ctx.Err()
	}
	_, err := Do(context.Background(), m, Key{ID: "slow"}, fn)
	require.ErrorIs(t, err, ErrExecutionTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = Do(context.Background(), other, Key{ID: "slow"}, fn)
	require.ErrorIs(t, err, ErrInterrupted)
	_, err = Do(context.Background(), m, Key{ID: "slow"}, fn)
	require.ErrorIs(t, err, ErrInterrupted)
	require.EqualValues(t, 1, effects.Load())
}

// A handler that the execution timeout cut off keeps its key, whatever it
// answered: a handler that returns on ctx.Done without writing is sent as
// an empty 200 by net/http, and that is no answer to replay for a day.
func TestAHandlerCutOffByTheExecutionTimeoutKeepsTheKey(t *testing.T) {
	s := newShop(t, WithExecutionTimeout(200*time.Millisecond))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // gives up silently
	}
	c := s.client()
	first := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusOK, first.status)
	require.Empty(t, first.body)
	requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "interrupted")
	require.EqualValues(t, 1, s.execs.Load())
}

// A run cut off by the execution timeout that still finished (its handler
// wrote a 2xx, its function returned no error) did its work: its answer is
// the key's, and no retry runs it again.
func TestACutOffRunThatSucceededIsStored(t *testing.T) {
	s := newShop(t, WithExecutionTimeout(100*time.Millisecond))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		s.defaultHandler(w, r) // finishes its work regardless, and says so
	}
	c := s.client()
	first := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	dup := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.Equal(t, first.body, dup.body)

	m, other := twoInstances(t, WithExecutionTimeout(100*time.Millisecond))
	runs := 0
	fn := func(ctx context.Context) (int, error) {
		runs++
		<-ctx.Done()
		return 42, nil
	}
	got, err := Do(context.Background(), m, Key{ID: "k"}, fn)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	got, err = Do(context.Background(), other, Key{ID: "k"}, fn)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.Equal(t, 1, runs)
	require.EqualValues(t, 1, s.execs.Load())
}

// A run that panics after the middleware cut it off may have done its
// work before it noticed: its key is kept, even before a status went out.
func TestARunThatPanicsOnceCutOffKeepsTheKey(t *testing.T) {
	s := newShop(t, WithExecutionTimeout(100*time.Millisecond))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		panic(context.Cause(r.Context())) // a must(err) on the context's error
	}
	c := s.client()
	s.postDropped("/payments", "k", `{}`)
	requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "interrupted")
	require.EqualValues(t, 1, s.execs.Load())
}

// A handler that stops short of the Content-Length it declared leaves its
// client with a body cut short; the retry is never sent that part as a
// complete answer.
func TestAnAnswerShortOfItsLengthIsNotReplayed(t *testing.T) {
	s := newShop(t)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "20")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "first half")
	}
	c := s.client()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
	req.Header.Set(KeyHeader, "short")
	if resp, err := c.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	requireProblem(t, s.post(c, "/payments", "short", `{}`), http.StatusConflict, "not-replayable")
	require.EqualValues(t, 1, s.execs.Load())
}

// Undoing a takeover (its claim's reply was lost, or its run did nothing)
// hands the key back to the executor it was taken from, which may be
// stalled rather than gone: that executor still stores its answer, and
// the key is never left free after it took effect.
func TestUndoingATakeoverHandsTheKeyBack(t *testing.T) {
	s := newShop(t, WithRetryAbandoned())
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	stalled, c := crashAfterClaim(t, s, k, "fp")
	lock, err := newTestLock()
	require.NoError(t, err)
	taken, err := s.idem.redis.claim(t.Context(), k, lock.Value(), "fp")
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, taken.outcome)
	require.True(t, taken.retaken)

	require.NoError(t, s.idem.redis.release(t.Context(), k, lock.Value()))
	got, err := redistest.ReadRecord(t.Context(), s.rdb, k.record)
	require.NoError(t, err)
	require.Equal(t, []string{"run", stalled, strconv.FormatUint(c.fence, 10)}, []string{got.State, got.Owner, got.Fence},
		"back to the stalled executor")

	how, err := s.idem.redis.completeWith(t.Context(), k, stalled, fingerprintSum([]byte(strings.Repeat("f", 32))),
		c.fence, newRecord(201, nil, []byte("late")), time.Minute)
	require.NoError(t, err)
	require.Equal(t, completed, how, "the stalled executor's answer is the key's")
}

// A status net/http refuses (below 100, above 999) never goes out: the
// handler's panic then still releases the key, and the retry runs.
func TestAnInvalidStatusIsNoStatusSent(t *testing.T) {
	s := newShop(t)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if s.execs.Load() == 1 {
			w.WriteHeader(1000)
		}
		s.defaultHandler(w, r)
	}
	c := s.client()
	s.postDropped("/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", `{}`).status)
	require.EqualValues(t, 2, s.execs.Load())
}

// A function error still releases the key when the middleware did not cut
// the function off: a retry (a redelivered message) runs it again.
func TestDoErrorReleasesTheKey(t *testing.T) {
	m, other := twoInstances(t)
	runs := 0
	_, err := Do(context.Background(), m, Key{ID: "k"}, func(context.Context) (int, error) {
		runs++
		return 0, errors.New("declined")
	})
	require.Error(t, err)
	require.Equal(t, "declined", err.Error())
	got, err := Do(context.Background(), other, Key{ID: "k"}, func(context.Context) (int, error) { runs++; return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, got)
	require.Equal(t, 2, runs)
}

// With WithRetryAbandoned another executor may take a key over once its
// lease is lost, so the run is cancelled with ErrLockLost; Do keeps the key
// for that executor and returns the cause with the function's error.
func TestDoCutOffByALostLeaseKeepsTheKey(t *testing.T) {
	m, _ := twoInstances(t, WithLockLease(300*time.Millisecond), WithRetryAbandoned())
	k := functionKeys(m, "lost")
	_, err := Do(context.Background(), m, Key{ID: "lost"}, func(ctx context.Context) (string, error) {
		m.redis.client.Del(context.Background(), k.lock) // the lease is gone
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), ErrLockLost)
		return "", ctx.Err()
	})
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, "run", redistest.RecordState(context.Background(), m.redis.client, k.record),
		"kept claimed, for a takeover")
}

// Without an executor that could take the key over, a lost lease does not
// cancel the handler: it runs on, and its real answer is stored and
// replayed, never a cancellation's 500.
func TestALostLeaseWithoutTakeoverLetsTheHandlerFinish(t *testing.T) {
	s := newShop(t, WithLockLease(300*time.Millisecond))
	k := clientKeys(s.idem.cfg.prefix, paymentID("stalled"))
	var cancelled atomic.Bool
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		s.rdb.Del(r.Context(), k.lock) // as if Redis had stalled past the lease
		time.Sleep(500 * time.Millisecond)
		cancelled.Store(r.Context().Err() != nil)
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.post(c, "/payments", "stalled", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.False(t, cancelled.Load(), "the handler's context was not cancelled")
	dup := s.post(c, "/payments", "stalled", `{}`)
	require.Equal(t, http.StatusCreated, dup.status)
	require.Equal(t, "true", dup.header.Get(ReplayedHeader))
	require.Equal(t, first.body, dup.body)
	require.EqualValues(t, 1, s.execs.Load())
}

// A release that Redis does not answer at once (a stall of a few hundred
// milliseconds) is tried again in the background: the retry runs the
// handler again, and is never told 409 interrupted.
func TestAReleaseOutlastsARedisStall(t *testing.T) {
	releases := map[string]func(w http.ResponseWriter, r *http.Request){
		"Release": func(w http.ResponseWriter, r *http.Request) {
			Release(r.Context())
			w.WriteHeader(http.StatusUnprocessableEntity)
		},
		"policy": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		},
		"panic before the status": func(http.ResponseWriter, *http.Request) {
			panic("boom")
		},
	}
	for name, release := range releases {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Private(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			s := newShopOn(t, rdb, WithStoreTimeout(100*time.Millisecond), WithLockLease(3*time.Second),
				WithStorePolicy(StoreNoTransient))
			resumed := make(chan struct{})
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				if s.execs.Load() > 1 {
					s.defaultHandler(w, r)
					return
				}
				require.NoError(t, srv.Signal(syscall.SIGSTOP))
				time.AfterFunc(400*time.Millisecond, func() {
					srv.Signal(syscall.SIGCONT)
					close(resumed)
				})
				release(w, r)
			}
			c := s.client()
			if name == "panic before the status" {
				c.Transport = &http.Transport{} // the server drops the connection: no retry on a pooled one
			}
			// On a busy machine a claim can outlast the store timeout: it is
			// refused 503 before the handler runs, and the request is sent
			// again until the handler has run.
			first := s.postAsync(c, "/payments", "k", `{}`)
			bound := time.After(10 * time.Second)
			for ran := false; !ran; {
				select {
				case <-resumed:
					ran = true
				case <-first:
					first = nil
					if s.execs.Load() == 0 {
						first = s.postAsync(c, "/payments", "k", `{}`)
					}
				case <-bound:
					t.Fatal("Redis was not resumed")
				}
			}
			retry := s.post(c, "/payments", "k", `{}`)
			require.Equal(t, http.StatusCreated, retry.status, retry.body)
			require.EqualValues(t, 2, s.execs.Load())
		})
	}
}

// withDeadline is an outer middleware that bounds each request's context,
// as many API gateways' Go middlewares do.
func withDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// A duplicate that waits for the original until its own context's deadline
// passes (an outer timeout, not a client that left) is answered 409
// in-progress with Retry-After, on the original's instance (waiting in
// memory) and on another (waiting on Redis): never an empty 200.
func TestAWaitEndedByTheCallersDeadlineIsAnswered(t *testing.T) {
	for _, where := range []string{"same instance", "other instance"} {
		t.Run(where, func(t *testing.T) {
			prefix := "test-" + strings.ReplaceAll(t.Name(), "/", "-")
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(700 * time.Millisecond)
				w.WriteHeader(http.StatusCreated)
			})
			a := New(redistest.Client(t, prefix), WithKeyPrefix(prefix), WithCallerCredentials())
			b := a
			if where == "other instance" {
				b = New(redistest.Client(t, prefix), WithKeyPrefix(prefix), WithCallerCredentials())
			}
			first := httptest.NewServer(a.ProtectKey(slow))
			t.Cleanup(first.Close)
			second := httptest.NewServer(withDeadline(150*time.Millisecond, b.ProtectKey(slow)))
			t.Cleanup(second.Close)

			original := make(chan error, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, first.URL, strings.NewReader(`{}`))
				req.Header.Set(KeyHeader, "k")
				_, err := tryDo(http.DefaultClient, req)
				original <- err
			}()
			time.Sleep(100 * time.Millisecond) // the original is running
			req, _ := http.NewRequest(http.MethodPost, second.URL, strings.NewReader(`{}`))
			req.Header.Set(KeyHeader, "k")
			dup := do(t, http.DefaultClient, req)
			requireProblem(t, dup, http.StatusConflict, "in-progress")
			require.NotEmpty(t, dup.header.Get("Retry-After"))
			require.NoError(t, <-original)
		})
	}
}

// A genuine retry of the request a key stored is replayed, even while a
// different request with the same key leads the key's flight in this
// process: the key's record decides, not whoever leads.
func TestARetryIsNotRefusedForAnotherRequestsFlight(t *testing.T) {
	srv := redistest.Private(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	s := newShopOn(t, rdb, WithResponseCache(0, 0), WithStoreTimeout(5*time.Second))
	c := s.client()
	first := s.post(c, "/payments", "k", `{"amount":5}`)
	require.Equal(t, http.StatusCreated, first.status)

	require.NoError(t, srv.Signal(syscall.SIGSTOP)) // the other request's claim is slow
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	other := s.postAsync(c, "/payments", "k", `{"amount":500}`)
	time.Sleep(100 * time.Millisecond) // it leads the key's flight
	retry := s.postAsync(c, "/payments", "k", `{"amount":5}`)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	resumed = true

	got := (<-retry).must(t)
	require.Equal(t, http.StatusCreated, got.status, got.body)
	require.Equal(t, "true", got.header.Get(ReplayedHeader))
	require.Equal(t, first.body, got.body)
	requireProblem(t, (<-other).must(t), http.StatusUnprocessableEntity, "key-reused")
	require.EqualValues(t, 1, s.execs.Load())
}

// Resolve and Forget that Redis ran, but whose reply was lost and resent by
// go-redis, report success: the resend finds its own work done.
func TestSettlingSurvivesALostReply(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := clientTo(t, proxy.Addr())
	s := newShopOn(t, rdb, WithKeyPrefix("lost-settle"))
	require.NoError(t, keyspace.LoadScripts(t.Context(), rdb))
	_, settleHash := keyspace.ScriptHashes()
	c := s.client()

	k, fp := interruptedPayment(t, s, "resolved")
	st, err := s.idem.operated().Inspect(t.Context(), k.record)
	require.NoError(t, err)
	proxy.DropNextReply(settleHash)
	require.NoError(t, resolve(t.Context(), s.idem, st, Answer{Status: http.StatusCreated, Body: []byte(`{"ok":true}`), Fingerprint: fp}))
	require.EqualValues(t, 1, proxy.Dropped())
	got := s.post(c, "/payments", "resolved", `{}`)
	require.Equal(t, http.StatusCreated, got.status)
	require.Equal(t, `{"ok":true}`, got.body)

	k, _ = interruptedPayment(t, s, "forgotten")
	st, err = s.idem.operated().Inspect(t.Context(), k.record)
	require.NoError(t, err)
	proxy.DropNextReply(settleHash)
	require.NoError(t, s.idem.operated().Forget(t.Context(), st))
	require.EqualValues(t, 2, proxy.Dropped())
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "forgotten", `{}`).status)
	require.EqualValues(t, 1, s.execs.Load(), "the forgotten key ran again")
}

// Once an operator resolved a key, its executor, stalled rather than gone,
// cannot make its own answer the key's when it wakes: every duplicate, on
// its instance too, gets the resolved answer. Before the claim horizon the
// operator is refused: the executor may be live, its lock lapsed under a
// stall, and still store its answer.
func TestAResolvedKeyIsNotTheStalledExecutors(t *testing.T) {
	m, other := twoInstances(t, WithLockLease(300*time.Millisecond), WithExecutionTimeout(200*time.Millisecond),
		WithStoreTimeout(100*time.Millisecond))
	k := functionKeys(m, "k")
	started, wake := make(chan struct{}), make(chan struct{})
	mine := make(chan string, 1)
	go func() {
		v, _ := Do(context.Background(), m, Key{ID: "k"}, func(context.Context) (string, error) {
			close(started)
			<-wake
			return "mine", nil
		})
		mine <- v
	}()
	<-started
	stall := func() keyspace.State { // the executor stalls past its lease: its renewals never land
		m.redis.client.Del(context.Background(), k.lock)
		st, err := other.operated().Inspect(context.Background(), k.record)
		require.NoError(t, err)
		return st
	}
	st := stall()
	require.False(t, st.Interrupted, "a lapsed lock before the claim horizon: the executor may still store")
	st.Interrupted = true // as an operator who read it earlier, or forged it
	require.ErrorIs(t, resolve(context.Background(), other, st, Answer{Status: statusResult, Body: []byte(`"early"`)}),
		keyspace.ErrNotInterrupted)
	require.Eventually(t, func() bool { st = stall(); return st.Interrupted }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, resolve(context.Background(), other, st, Answer{Status: statusResult, Body: []byte(`"resolved"`)}))

	close(wake)
	require.Equal(t, "mine", <-mine, "the executor's own caller gets what it ran")
	for _, instance := range []*Middleware{m, other} {
		got, err := Do(context.Background(), instance, Key{ID: "k"}, func(context.Context) (string, error) {
			t.Error("ran again")
			return "", nil
		})
		require.NoError(t, err)
		require.Equal(t, "resolved", got)
	}
}

// Resolve keeps WithMaxResponseBytes: an answer over it settles the key as
// executed and not replayable.
func TestResolveKeepsTheResponseLimit(t *testing.T) {
	s := newShop(t, WithMaxResponseBytes(16))
	k, fp := interruptedPayment(t, s, "big")
	st, err := s.idem.operated().Inspect(t.Context(), k.record)
	require.NoError(t, err)
	big := []byte(strings.Repeat("x", 100))
	require.NoError(t, resolve(t.Context(), s.idem, st, Answer{Status: http.StatusCreated, Body: big, Fingerprint: fp}))
	requireProblem(t, s.post(s.client(), "/payments", "big", `{}`), http.StatusConflict, "not-replayable")
	require.EqualValues(t, 0, s.execs.Load())
}

// A record that vanishes while its handler runs (eviction, a flush) is
// written again when the answer is stored, the lock is let go at once, and
// the retry replays: never a second execution.
func TestRecordVanishingMidRunNeverRunsTwice(t *testing.T) {
	var logs syncbuf.Buffer
	s := newShop(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithResponseCache(0, 0))
	k := clientKeys(s.idem.cfg.prefix, paymentID("vanish"))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		s.rdb.Del(context.Background(), k.record) // evicted
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.post(c, "/payments", "vanish", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Zero(t, s.rdb.Exists(t.Context(), k.lock).Val(), "the lock is released with the store")
	retry := s.post(c, "/payments", "vanish", `{}`)
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader))
	require.Equal(t, first.body, retry.body)
	requireProblem(t, s.post(c, "/payments", "vanish", `{"other":1}`), 422, "key-reused")
	require.EqualValues(t, 1, s.execs.Load())
	require.Contains(t, logs.String(), "vanished while its handler ran")
	require.Empty(t, keysWithoutTTL(t, s.rdb, s.idem.cfg.prefix))
}

// Even in a full Redis (maxmemory reached), a record that vanished is
// written back with the answer: the retry replays, while Redis is still
// full (a duplicate's claim writes nothing), and a new key is refused.
func TestRecordVanishingInAFullRedis(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	s := newShopOn(t, rdb, WithResponseCache(0, 0))
	k := clientKeys(s.idem.cfg.prefix, paymentID("full"))
	ctx := context.Background()
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		rdb.Del(ctx, k.record)               // evicted
		rdb.ConfigSet(ctx, "maxmemory", "1") // and Redis is full
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.post(c, "/payments", "full", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	retry := s.post(c, "/payments", "full", `{}`)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader), retry.body)
	require.Equal(t, first.body, retry.body)
	// A full Redis refuses a new claim (503, nothing runs).
	requireProblem(t, s.post(c, "/payments", "full-new", `{}`), http.StatusServiceUnavailable, "store-unavailable")
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	require.EqualValues(t, 1, s.execs.Load())
}
