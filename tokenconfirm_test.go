package idempotency

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// stallOn makes rdb stop srv (SIGSTOP) just before the first command that
// matches, once armed (once), and resume it after d. wait waits for the
// resume, and fails t if the stop failed.
func stallOn(t *testing.T, rdb *redis.Client, srv func() *redistest.Server, name, key string, d time.Duration) (arm func(), fired func() bool, wait func()) {
	var armed atomic.Bool
	var stalls sync.WaitGroup
	var stopErr atomic.Pointer[error]
	rdb.AddHook(commandHook{before: func(cmd redis.Cmder) {
		args := cmd.Args()
		if strings.EqualFold(cmd.Name(), name) && len(args) > 1 && args[1] == key && armed.CompareAndSwap(true, false) {
			if err := srv().Signal(syscall.SIGSTOP); err != nil {
				stopErr.Store(&err)
			}
			time.AfterFunc(d, func() {
				defer stalls.Done()
				srv().Signal(syscall.SIGCONT)
			})
		}
	}})
	arm = func() {
		stalls.Add(1) // before the hook can fire: its resume is Done
		armed.Store(true)
	}
	return arm, func() bool { return !armed.Load() }, func() {
		stalls.Wait()
		if err := stopErr.Load(); err != nil {
			t.Fatal(*err)
		}
	}
}

// commandHook calls before ahead of every single command.
type commandHook struct{ before func(redis.Cmder) }

func (commandHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h commandHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.before(cmd)
		return next(ctx, cmd)
	}
}
func (commandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Confirming the token's secret is a round trip of its own when Redis lost
// the secret (the write-back), and under WithReplicaAcks (the claim does
// not ride). Redis stalls in it for longer than the lease: the handler
// must not start on the lost lease, or a retry on another instance, which
// takes the lapsed key over (WithRetryAbandoned), runs it a second time.
func TestNoHandlerStartsOnALeaseLostWhileTheSecretIsConfirmed(t *testing.T) {
	const lease = 400 * time.Millisecond
	for _, replicas := range []bool{false, true} {
		t.Run(map[bool]string{false: "write-back after a restart", true: "WithReplicaAcks"}[replicas], func(t *testing.T) {
			opts := []Option{WithKeyPrefix("stall"), WithLockLease(lease), WithStoreTimeout(3 * time.Second),
				WithRetryAbandoned()}
			var live atomic.Pointer[redistest.Server]
			command := "set"
			if replicas {
				primary, _ := primaryWithReplica(t)
				live.Store(primary)
				opts = append(opts, WithReplicaAcks(1, 200*time.Millisecond))
				command = "get"
			} else {
				live.Store(redistest.Private(t))
			}
			rdbA := live.Load().Client(t)
			arm, fired, wait := stallOn(t, rdbA, live.Load, command, "stall:token-secret", 3*lease)
			a := newShopOn(t, rdbA, opts...)
			b := newShopOn(t, live.Load().Client(t), opts...)
			var cutAtStart atomic.Int64
			a.handler = func(w http.ResponseWriter, r *http.Request) {
				if r.Context().Err() != nil {
					cutAtStart.Add(1)
				}
				time.Sleep(2 * lease)
				a.defaultHandler(w, r)
			}
			b.handler = a.handler
			c := a.client()
			tok := a.token(c)
			b.token(c) // b holds the same secret
			if !replicas {
				require.NoError(t, live.Load().Signal(syscall.SIGKILL))
				live.Store(redistest.Restart(t, live.Load()))
			}

			arm()
			done := a.postAsync(c, "/orders", tok, `{}`)
			require.Eventually(t, fired, 10*time.Second, 5*time.Millisecond)
			wait()
			time.Sleep(100 * time.Millisecond)
			b.post(c, "/orders", tok, `{}`)
			<-done
			require.Zero(t, cutAtStart.Load(), "a handler started on a lease that was already lost")
			require.LessOrEqual(t, a.execs.Load()+b.execs.Load(), int64(1), "one token ran twice")
		})
	}
}

// Redis stalls just as the confirmation writes the secret back, for longer
// than the store timeout: 503, nothing ran, and once Redis is back the
// claim's give-back (retried in the background) frees the key: the retry
// runs once and is never told interrupted.
func TestAStalledConfirmationGivesTheTokenBack(t *testing.T) {
	var live atomic.Pointer[redistest.Server]
	live.Store(redistest.Private(t))
	rdb := live.Load().Client(t)
	arm, _, wait := stallOn(t, rdb, live.Load, "set", "back:token-secret", 2500*time.Millisecond)
	a := newShopOn(t, rdb, WithKeyPrefix("back"), WithLockLease(time.Second), WithStoreTimeout(300*time.Millisecond))
	c := a.client()
	tok := a.token(c)
	require.NoError(t, live.Load().Signal(syscall.SIGKILL))
	live.Store(redistest.Restart(t, live.Load()))

	arm()
	requireProblem(t, a.post(c, "/orders", tok, `{}`), http.StatusServiceUnavailable, "store-unavailable")
	wait()
	require.Zero(t, a.execs.Load())
	var last answer
	require.Eventually(t, func() bool {
		last = a.post(c, "/orders", tok, `{}`)
		return last.status == http.StatusCreated || strings.Contains(last.body, "interrupted")
	}, 20*time.Second, 100*time.Millisecond)
	require.Equal(t, http.StatusCreated, last.status, last.body)
	require.EqualValues(t, 1, a.execs.Load())
}

// Redis restarts empty and a new instance makes a new secret, and spends a
// token of it. The retry reaches an instance that still holds the old
// secret (its recheck is not due): it must read the fleet's secret rather
// than answer token-not-found, which would make the form ask for a new
// token and order again.
func TestAStaleInstanceReadsTheSecretOfATokenItCannotCheck(t *testing.T) {
	srv := redistest.Private(t)
	opts := []Option{WithKeyPrefix("stale"), WithStoreTimeout(500 * time.Millisecond)}
	old := newShopOn(t, srv.Client(t), opts...)
	c := old.client()
	old.token(c) // old holds its secret, and the session is set

	require.NoError(t, srv.Signal(syscall.SIGKILL))
	redistest.Restart(t, srv)
	fresh := newShopOn(t, srv.Client(t), opts...)
	tok := fresh.token(c) // the restarted Redis takes fresh's new secret
	first := waitFor201(t, fresh, c, tok)

	again := old.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	require.Zero(t, old.execs.Load())

	// Forged tokens right after wait for the next read, one per
	// secretRetry, and share it.
	reads := commandsSeen(t, old.rdb.(*redis.Client), "get")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			requireProblem(t, old.post(c, "/orders", strings.Repeat("A", tokenLength), `{}`),
				http.StatusUnprocessableEntity, "token-not-found")
		})
	}
	wg.Wait()
	require.LessOrEqual(t, reads.Load(), int64(1))
}

// commandsSeen counts the commands of that name rdb sends from now on.
func commandsSeen(t *testing.T, rdb *redis.Client, name string) *atomic.Int64 {
	var n atomic.Int64
	rdb.AddHook(commandHook{before: func(cmd redis.Cmder) {
		if strings.EqualFold(cmd.Name(), name) {
			n.Add(1)
		}
	}})
	return &n
}

// An operator overwrites the secret with a value too short to sign with (a
// typo while revoking every token). The instance cannot tell whether the
// fleet moved: it spends nothing, answers 503 and says why in the log, and
// once the secret is a real one again the next form's token runs.
func TestAnUnusableSecretInRedisIsRefusedAndLogged(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	s := newShop(t, WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
	c := s.client()
	s.token(c)
	name := s.idem.cfg.prefix + ":token-secret"
	require.NoError(t, s.rdb.Set(t.Context(), name, "short", 0).Err())

	requireProblem(t, s.post(c, "/orders", s.token(c), `{}`), http.StatusServiceUnavailable, "store-unavailable")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "shorter than 32 bytes")
	}, 5*time.Second, 10*time.Millisecond)
	require.Zero(t, s.execs.Load())

	require.NoError(t, s.rdb.Set(t.Context(), name, "an operator's new secret, 32 bytes at least", 0).Err())
	recheckSecret(t, s.idem)
	// A read of the short secret that began before the operator's fix may
	// still land on a busy machine: a token issued under it is refused
	// (422, nothing runs), and the next one is issued under the new one.
	var got answer
	require.Eventually(t, func() bool {
		got = s.post(c, "/orders", s.token(c), `{}`)
		return got.status == http.StatusCreated
	}, 10*time.Second, 50*time.Millisecond, "the last answer: %d %s", got.status, got.body)
	require.EqualValues(t, 1, s.execs.Load())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// On Redis Cluster the secret lives on another node than a token's keys:
// the claim's reading of it goes there. A deleted secret is written back by
// the next spend, and a new instance replays it; once another instance
// made a new secret, a token of the old one runs nothing and is given
// back; racing duplicates of a fresh token on three instances run once.
func TestTheSecretIsConfirmedOnCluster(t *testing.T) {
	addrs := redistest.PrivateCluster(t, 3, 0)
	opts := []Option{WithKeyPrefix("clu"), WithStoreTimeout(time.Second)}
	a := newShopOn(t, clusterOf(t, addrs, nil), opts...)
	c := a.client()
	t1, t2 := a.token(c), a.token(c)
	operator := clusterOf(t, addrs, nil)
	require.NoError(t, operator.Del(t.Context(), "clu:token-secret").Err())
	first := a.post(c, "/orders", t1, `{}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	b := newShopOn(t, clusterOf(t, addrs, nil), opts...)
	again := b.post(c, "/orders", t1, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))

	require.NoError(t, operator.Del(t.Context(), "clu:token-secret").Err())
	fresh := newShopOn(t, clusterOf(t, addrs, nil), opts...)
	fresh.token(fresh.client()) // makes a new secret
	requireProblem(t, a.post(c, "/orders", t2, `{}`), http.StatusUnprocessableEntity, "token-not-found")
	require.EqualValues(t, 1, a.execs.Load())
	require.Eventually(t, func() bool { return secretOf(a.idem) == secretOf(fresh.idem) }, 5*time.Second, 10*time.Millisecond)

	next := a.token(c)
	var wg sync.WaitGroup
	for i := range 12 {
		s := []*shop{a, b, fresh}[i%3]
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader(`{}`))
			req.Header.Set(KeyHeader, next)
			got, err := tryDo(c, req)
			require.NoError(t, err)
			require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, got.status, "%s: %s", s.srv.URL, got.body)
		})
	}
	wg.Wait()
	require.EqualValues(t, 2, a.execs.Load()+b.execs.Load()+fresh.execs.Load())
}

// Redis restarts empty while a token's handler runs, after its claim was
// confirmed, and a new instance makes a new secret before the handler
// answers. The store writes the token's record back (at once, or from the
// background when Redis stalls at the store), and the instance stops
// right after its drain, before any recheck: the resubmission, on the new
// instance, must still find the record, whose secret only the stopped
// instance held, and replay it rather than answer token-not-found.
func TestATokenRecordWrittenBackOutlivesItsInstance(t *testing.T) {
	for _, stall := range []bool{false, true} {
		t.Run(map[bool]string{false: "stored at once", true: "stored in the background"}[stall], func(t *testing.T) {
			srv := redistest.Private(t)
			opts := []Option{WithKeyPrefix("back"), WithStoreTimeout(200 * time.Millisecond)}
			old := newShopOn(t, srv.Client(t), opts...)
			c := old.client()
			tok := old.token(c)
			var fresh *shop
			old.handler = func(w http.ResponseWriter, r *http.Request) {
				require.NoError(t, srv.Signal(syscall.SIGKILL))
				restarted := redistest.Restart(t, srv)
				fresh = newShopOn(t, restarted.Client(t), opts...)
				fresh.token(c) // the restarted Redis takes fresh's new secret
				if stall {
					require.NoError(t, restarted.Signal(syscall.SIGSTOP))
					time.AfterFunc(2*time.Second, func() { restarted.Signal(syscall.SIGCONT) })
				}
				old.defaultHandler(w, r)
			}
			first := old.post(c, "/orders", tok, `{}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			drain, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.NoError(t, old.idem.Shutdown(drain))

			again := fresh.post(c, "/orders", tok, `{}`)
			require.Equal(t, http.StatusCreated, again.status, again.body)
			require.Equal(t, "true", again.header.Get(ReplayedHeader))
			require.Equal(t, first.body, again.body)
			require.Zero(t, fresh.execs.Load())
		})
	}
}

// Another request's read of the secrets lands between a token's check and
// its refresh: the refresh answers at once that the token is to be checked
// again under what was read, rather than read again.
func TestARefreshAfterAnotherReadLandedChecksAgain(t *testing.T) {
	checked := time.Now()
	s := &tokenSigner{shared: true, refreshed: checked, read: checked.Add(time.Millisecond)}
	again, err := s.refresh(t.Context(), checked)
	require.NoError(t, err)
	require.True(t, again, "a read started since the check")
}

// A token of a secret that the fleet retired a moment ago reaches an
// instance that never held it, just after a forged token made it read the
// fleet's secrets (reads for unknown tokens are limited to one a second).
// The token was spent: it waits for the next read, which finds its secret
// among the retired ones, and replays, rather than be told token-not-found
// (its form would ask for a new token and order again). A forged token
// waits as long, and is refused.
func TestATokenRetiredAMomentAgoWaitsForTheNextRead(t *testing.T) {
	a := newShop(t)
	c := a.client()
	tok := a.token(c)
	first := a.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)

	overwriteSecret(t, a, "an operator's new secret, 32 bytes at least")
	fresh := newShopOn(t, a.rdb, WithKeyPrefix(a.idem.cfg.prefix))
	forged := forge(tok)
	requireProblem(t, fresh.post(c, "/orders", forged, `{}`), http.StatusUnprocessableEntity, "token-not-found")
	recheckSecret(t, a.idem) // a adopts the new secret and retires its own

	again := fresh.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	requireProblem(t, fresh.post(c, "/orders", forged, `{}`), http.StatusUnprocessableEntity, "token-not-found")
	require.EqualValues(t, 1, a.execs.Load()+fresh.execs.Load())
}

// While Redis cannot say which secrets the fleet holds, a token that none
// here signed is answered 503, not token-not-found: it may be the fleet's,
// and spent.
func TestAnUnknownTokenIsNotRefusedWhileRedisCannotSay(t *testing.T) {
	srv := redistest.Private(t)
	s := newShopOn(t, srv.Client(t), WithKeyPrefix("unknown"), WithStoreTimeout(300*time.Millisecond))
	c := s.client()
	forged := forge(s.token(c))
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	defer srv.Signal(syscall.SIGCONT)
	for range 3 { // the read, and the failure remembered
		a := s.post(c, "/orders", forged, `{}`)
		requireProblem(t, a, http.StatusServiceUnavailable, "store-unavailable")
		require.NotEmpty(t, a.header.Get("Retry-After"))
	}
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		return s.post(c, "/orders", forged, `{}`).status == http.StatusUnprocessableEntity
	}, 10*time.Second, 50*time.Millisecond)
	require.Zero(t, s.execs.Load())
}

// forge is tok with one character changed: a token of the right form
// that no secret signed.
func forge(tok string) string {
	b := []byte(tok)
	i := len(b) / 2
	b[i] = map[bool]byte{true: 'B', false: 'A'}[b[i] == 'A']
	return string(b)
}

// A flood of tokens that no secret here signed: a few hundred wait for the
// next read of the fleet's secrets, and the rest are answered 503 at once
// rather than held, or told token-not-found.
func TestUnknownTokensBeyondTheWaitersAreUnavailable(t *testing.T) {
	s := &tokenSigner{shared: true, refreshed: time.Now()}
	s.waiters.Store(maxRefreshWaiters)
	_, err := s.refresh(t.Context(), time.Now())
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.EqualValues(t, maxRefreshWaiters, s.waiters.Load())
}
