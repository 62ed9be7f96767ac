package idempotency

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

var long = flag.Bool("long", false, "run the long variants of the reliability and load tests")

// trials picks the default or the -long count.
func trials(normal, longer int) int {
	if *long {
		return longer
	}
	return normal
}

// counting is a handler that counts executions per idempotency key and
// answers with the key and its execution number, so that a replay can be
// told from a second execution byte for byte.
type counting struct {
	mu    sync.Mutex
	runs  map[string]int
	delay time.Duration
}

func newCounting(delay time.Duration) *counting {
	return &counting{runs: make(map[string]int), delay: delay}
}

func (h *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(KeyHeader)
	h.mu.Lock()
	h.runs[key]++
	n := h.runs[key]
	h.mu.Unlock()
	time.Sleep(h.delay)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"execution":%d}`, key, n)
}

// doubles lists the keys that ran more than once.
func (h *counting) doubles() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k, n := range h.runs {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", k, n))
		}
	}
	return out
}

func (h *counting) executions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	total := 0
	for _, n := range h.runs {
		total += n
	}
	return total
}

// send runs one key-mode request through h, in process.
func send(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set(KeyHeader, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func reliabilityRedis(t *testing.T) (redis.UniversalClient, string) {
	prefix := "test-" + strings.ReplaceAll(t.Name(), "/", "-")
	return redistest.Client(t, prefix), prefix
}

// Concurrent duplicates: K requests per key at once, split over two
// instances; exactly one execution, every other answer a byte-identical
// replay or a 409 problem.
func TestConcurrentDuplicateTrials(t *testing.T) {
	for _, k := range []int{2, 10, 100} {
		t.Run(fmt.Sprintf("K=%d", k), func(t *testing.T) {
			rdb, prefix := reliabilityRedis(t)
			h := newCounting(time.Millisecond)
			a := New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(h)
			b := New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(h)
			n := trials(200, 1000)
			replays, conflicts := 0, 0
			for trial := range n {
				key := fmt.Sprintf("trial-%d", trial)
				answers := make([]*httptest.ResponseRecorder, k)
				var wg sync.WaitGroup
				for i := range k {
					inst := []http.Handler{a, b}[i%2]
					wg.Go(func() { answers[i] = send(inst, key, `{}`) })
				}
				wg.Wait()
				want := fmt.Sprintf(`{"key":%q,"execution":1}`, key)
				for _, ans := range answers {
					switch ans.Code {
					case http.StatusCreated:
						require.Equal(t, want, ans.Body.String())
						if ans.Header().Get(ReplayedHeader) == "true" {
							replays++
						}
					case http.StatusConflict:
						require.Contains(t, ans.Body.String(), "problem-in-progress")
						conflicts++
					default:
						t.Fatalf("trial %d: unexpected %d %s", trial, ans.Code, ans.Body)
					}
				}
			}
			require.Empty(t, h.doubles())
			require.Equal(t, n, h.executions())
			t.Logf("K=%d: %d trials, %d requests, %d executions, %d replays, %d conflicts, 0 double executions",
				k, n, n*k, h.executions(), replays, conflicts)
		})
	}
}

// A handler that outlives several lock leases keeps its key (the watchdog
// renews it), so a duplicate on another instance waits and replays instead
// of taking over, even with WithRetryAbandoned on, which would run the
// handler again had the lease lapsed.
func TestLeaseShorterThanHandlerTrials(t *testing.T) {
	rdb, prefix := reliabilityRedis(t)
	// Leases short enough to expire several times over, long enough that a
	// loaded 2-core machine running the race detector still renews in time:
	// a renewal is due every third of a lease, and the lease is lost once
	// the machine stalls past the rest. With 300 ms, stalls of 200 ms (seen
	// beside two busy loops and other builds) lost every lease at once.
	const lease = time.Second
	h := newCounting(3 * lease)
	opts := []Option{WithKeyPrefix(prefix), WithCallerCredentials(), WithLockLease(lease), WithRetryAbandoned()}
	a, b := New(rdb, opts...).ProtectKey(h), New(rdb, opts...).ProtectKey(h)
	send(a, "warm-up", `{}`) // loads the scripts, the watchdog's included
	n := trials(200, 1000)
	var replays atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 100) // trials mostly sleep: two rounds of 3 s
	for trial := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			key := fmt.Sprintf("lease-%d", trial)
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- send(a, key, `{}`) }()
			time.Sleep(3 * lease / 2) // past the first lease
			dup := send(b, key, `{}`)
			orig := <-first
			if dup.Code == http.StatusCreated && dup.Body.String() == orig.Body.String() {
				replays.Add(1)
			}
		})
	}
	wg.Wait()
	require.Empty(t, h.doubles())
	require.Equal(t, n+1, h.executions())
	t.Logf("%d trials of a %v handler under a %v lease: %d executions, %d duplicates replayed, 0 double executions",
		n, 3*lease, lease, n, replays.Load())
	require.EqualValues(t, n, replays.Load())
}

// A paused executor whose lease ran out cannot store its result over the
// executor that took its key over, whether it wakes after the takeover
// stored its answer or while the takeover still runs.
func TestStaleExecutorTrials(t *testing.T) {
	rdb, prefix := reliabilityRedis(t)
	// The stale executor has the shortest lease there is. The executor that
	// takes over has one that no trial outlives: had its lease run out too
	// (a loaded machine can stall it between two steps), the trial would
	// prove nothing about the stale one.
	stale := New(rdb, WithKeyPrefix(prefix), WithLockLease(100*time.Millisecond)).redis
	fresh := New(rdb, WithKeyPrefix(prefix), WithLockLease(time.Minute), WithRetryAbandoned()).redis
	n := trials(200, 1000)
	errs := make([]error, n)
	var late atomic.Int64
	var wg sync.WaitGroup
	// As many trials at once as the client has connections (ten per CPU):
	// more would only queue for one, and the queue is time the stale
	// executor's short lease does not have.
	sem := make(chan struct{}, 10*runtime.GOMAXPROCS(0))
	for trial := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[trial] = staleExecutorTrial(t.Context(), rdb, stale, fresh, prefix, trial, &late)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	t.Logf("%d stale executors tried to store over a takeover, half of them before the takeover stored its answer: "+
		"all refused (%d more claims ran only after their lease and were tried again)", n, late.Load())
}

// staleExecutorTrial plays one stale executor against a takeover, on a key
// of its own, and returns what went wrong. A stale claim that Redis ran only
// after its lease had run out (a stall on a loaded machine) claimed
// nothing, so no stale executor exists and the trial starts again on a new
// key; late counts those.
func staleExecutorTrial(ctx context.Context, rdb redis.UniversalClient, stale, fresh *redisStore, prefix string, trial int, late *atomic.Int64) error {
	// A deadline of the test's own: a busy client pool can outlast 100 ms.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for attempt := range 100 {
		k := clientKeys(prefix, paymentID(fmt.Sprintf("stale-%d-%d", trial, attempt)))
		staleLock, err := newTestLock()
		if err != nil {
			return fmt.Errorf("trial %d: the stale executor's lock: %w", trial, err)
		}
		sc, err := stale.claim(ctx, k, staleLock.Value(), "fp")
		if err != nil {
			return fmt.Errorf("trial %d: the stale executor's claim: %w", trial, err)
		}
		if sc.outcome == outcomeHeld {
			late.Add(1)
			continue
		}
		if sc.outcome != outcomeClaimed {
			return fmt.Errorf("trial %d: the stale executor's claim: outcome %d", trial, sc.outcome)
		}
		// The stale executor pauses: nothing renews its lease. The other
		// executor takes the key over once the lease has run out, however
		// long the machine took to get there.
		freshLock, fc, err := claimWhenFree(ctx, fresh, k)
		switch {
		case err != nil:
			return fmt.Errorf("trial %d: the takeover's claim: %w", trial, err)
		case fc.outcome != outcomeClaimed:
			return fmt.Errorf("trial %d: the takeover's claim: outcome %d, want claimed", trial, fc.outcome)
		case fc.fence <= sc.fence:
			return fmt.Errorf("trial %d: the takeover's fencing token %d does not outrank the stale %d", trial, fc.fence, sc.fence)
		}
		staleWrite := func() error {
			_, err := stale.completeWith(ctx, k, staleLock.Value(), fingerprintSum{}, 1, newRecord(500, nil, []byte("stale")), time.Hour)
			if !errors.Is(err, ErrLockLost) {
				return fmt.Errorf("trial %d: the stale executor's write answered %v, want ErrLockLost", trial, err)
			}
			return nil
		}
		wakesEarly := trial%2 == 1 // while the takeover still runs
		if wakesEarly {
			if err := staleWrite(); err != nil {
				return err
			}
		}
		done, err := fresh.completeWith(ctx, k, freshLock.Value(), fingerprintSum{}, 1, newRecord(201, nil, []byte("fresh")), time.Hour)
		if err != nil || done != completed {
			return fmt.Errorf("trial %d: the takeover's write: %v, %v", trial, done, err)
		}
		if !wakesEarly {
			if err := staleWrite(); err != nil {
				return err
			}
		}
		rec, err := redistest.ReadRecord(ctx, rdb, k.record)
		if err != nil {
			return fmt.Errorf("trial %d: reading the record: %w", trial, err)
		}
		got := []string{rec.State, rec.Status, rec.Body, rec.Owner}
		if want := []string{"done", "201", "fresh", freshLock.Value()}; fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("trial %d: the record holds %q, want the takeover's %q", trial, got, want)
		}
		return nil
	}
	return fmt.Errorf("trial %d: in 100 attempts no stale claim ran within its lease", trial)
}

// claimWhenFree claims k for s as soon as its lock's holder lets it go or
// its lease runs out, as an instance that found the key taken waits.
func claimWhenFree(ctx context.Context, s *redisStore, k keys) (testLock, claim, error) {
	for {
		lock, err := newTestLock()
		if err != nil {
			return "", claim{}, err
		}
		c, err := s.claim(ctx, k, lock.Value(), "fp")
		if err != nil || c.outcome != outcomeHeld {
			return lock, c, err
		}
		select {
		case <-ctx.Done():
			return "", claim{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Panics, client disconnects and server shutdowns mid-request, 100 trials
// each: the documented outcome, and a retry that gets the documented answer.
func TestInterruptionTrials(t *testing.T) {
	n := trials(100, 500)
	t.Run("panic", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(0)
		panicky := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Panic") == "before" {
				panic("boom") // before any effect and before the status
			}
			h.ServeHTTP(w, r)
			if r.Header.Get("X-Panic") == "after" {
				panic(http.ErrAbortHandler) // after the effect and the status
			}
		})
		m := New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(panicky)
		for trial := range n {
			when := [...]string{"before", "after"}[trial%2]
			key := fmt.Sprint("panic-", trial)
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
			r.Header.Set(KeyHeader, key)
			r.Header.Set("X-Panic", when)
			require.Panics(t, func() { m.ServeHTTP(httptest.NewRecorder(), r) })
			if when == "before" {
				// Released: the retry runs, once, and its duplicate replays.
				require.Equal(t, http.StatusCreated, send(m, key, `{}`).Code)
				require.Equal(t, "true", send(m, key, `{}`).Header().Get(ReplayedHeader))
				continue
			}
			// Kept: the handler may have taken effect, so no retry runs it.
			require.Equal(t, http.StatusConflict, send(m, key, `{}`).Code)
		}
		t.Logf("%d panics: released before the status, kept after it (%d executions in all)", n, h.executions())
		require.Equal(t, n, h.executions())
	})
	t.Run("client disconnect", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(30 * time.Millisecond)
		srv := httptest.NewServer(New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(h))
		t.Cleanup(srv.Close)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 20)
		errs := make([]error, n)
		for trial := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				key := fmt.Sprint("gone-", trial)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
				req.Header.Set(KeyHeader, key)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
				// The retry finds the aborted request's result.
				replayed := func() bool {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
					req.Header.Set(KeyHeader, key)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return false
					}
					resp.Body.Close()
					return resp.StatusCode == http.StatusCreated && resp.Header.Get(ReplayedHeader) == "true"
				}
				for deadline := time.Now().Add(10 * time.Second); !replayed(); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						errs[trial] = fmt.Errorf("%s: no retry got the aborted request's replay within 10s", key)
						return
					}
				}
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		require.Empty(t, h.doubles())
		require.Equal(t, n, h.executions())
		t.Logf("%d aborted requests: every handler ran to completion once and every retry got its replay", n)
	})
	t.Run("server shutdown", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(50 * time.Millisecond)
		other := New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(h)
		replayed := 0
		for trial := range n / 4 {
			srv := httptest.NewServer(New(rdb, WithKeyPrefix(prefix), WithCallerCredentials()).ProtectKey(h))
			before := h.executions()
			var wg sync.WaitGroup
			for i := range 4 {
				key := fmt.Sprintf("shutdown-%d-%d", trial, i)
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{}`))
					req.Header.Set(KeyHeader, key)
					req.Host = "example.com" // as send addresses the other instance: one service, one name
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				})
			}
			// Shut down once the handlers run: Shutdown waits for them.
			require.Eventually(t, func() bool { return h.executions() == before+4 }, 5*time.Second, time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, srv.Config.Shutdown(ctx), "shutdown waits for the handlers")
			cancel()
			wg.Wait()
			srv.Close()
			for i := range 4 {
				ans := send(other, fmt.Sprintf("shutdown-%d-%d", trial, i), `{}`)
				require.Equal(t, http.StatusCreated, ans.Code)
				require.Equal(t, "true", ans.Header().Get(ReplayedHeader), "the retry on another instance replays")
				replayed++
			}
		}
		require.Empty(t, h.doubles())
		t.Logf("%d requests interrupted by a graceful shutdown: all completed and stored, %d retries on another instance replayed", h.executions(), replayed)
	})
}
