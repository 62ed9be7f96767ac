package idempotency

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/require"
	"github.com/redis/go-redis/v9"
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
			a := New(rdb, WithKeyPrefix(prefix)).ProtectKey(h)
			b := New(rdb, WithKeyPrefix(prefix)).ProtectKey(h)
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
	// loaded 2-core machine running the race detector still renews in time.
	const lease = 300 * time.Millisecond
	h := newCounting(3 * lease)
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(lease), WithRetryAbandoned()}
	a, b := New(rdb, opts...).ProtectKey(h), New(rdb, opts...).ProtectKey(h)
	send(a, "warm-up", `{}`) // loads the scripts, the watchdog's included
	n := trials(200, 1000)
	var replays atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 40)
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
// executor that took its key over.
func TestStaleExecutorTrials(t *testing.T) {
	rdb, prefix := reliabilityRedis(t)
	m := New(rdb, WithKeyPrefix(prefix), WithLockLease(100*time.Millisecond), WithRetryAbandoned())
	ctx := context.Background()
	n := trials(200, 1000)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for trial := range n {
		wg.Go(func() {
			k := clientKeys(prefix, identityOf(false, "/payments", fmt.Sprint("stale-", trial)))
			stale, err := m.store.obtain(ctx, k)
			require.NoError(t, err)
			_, err = m.store.claim(ctx, k, stale.Token(), "fp")
			require.NoError(t, err)
			time.Sleep(120 * time.Millisecond) // paused past the lease
			fresh, err := m.store.obtain(ctx, k)
			require.NoError(t, err)
			c, err := m.store.claim(ctx, k, fresh.Token(), "fp")
			require.NoError(t, err)
			require.Equal(t, outcomeClaimed, c.outcome)
			_, err = m.store.complete(ctx, k, fresh.Token(), fingerprintSum{}, 1, newRecord(201, nil, []byte("fresh")), time.Hour)
			require.NoError(t, err)
			if _, err := m.store.complete(ctx, k, stale.Token(), fingerprintSum{}, 1, newRecord(500, nil, []byte("stale")), time.Hour); err == ErrLockLost {
				refused.Add(1)
			}
			require.Equal(t, "fresh", rdb.HGet(ctx, k.record, "b").Val())
		})
	}
	wg.Wait()
	t.Logf("%d stale executors tried to store over a takeover: %d refused", n, refused.Load())
	require.EqualValues(t, n, refused.Load())
}

// Panics, client disconnects and server shutdowns mid-request, 100 trials
// each: the documented outcome, and a retry that gets the documented answer.
func TestInterruptionTrials(t *testing.T) {
	n := trials(100, 500)
	t.Run("panic", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(0)
		panicky := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r)
			if r.Header.Get("X-Panic") != "" {
				panic("boom")
			}
		})
		m := New(rdb, WithKeyPrefix(prefix)).ProtectKey(panicky)
		for trial := range n {
			key := fmt.Sprint("panic-", trial)
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
			r.Header.Set(KeyHeader, key)
			r.Header.Set("X-Panic", "1")
			require.Panics(t, func() { m.ServeHTTP(httptest.NewRecorder(), r) })
			// Released: the retry runs, once, and its duplicate replays.
			require.Equal(t, http.StatusCreated, send(m, key, `{}`).Code)
			require.Equal(t, "true", send(m, key, `{}`).Header().Get(ReplayedHeader))
		}
		t.Logf("%d panics: lock released every time, the retry ran once each (%d executions in all)", n, h.executions())
		require.Equal(t, 2*n, h.executions())
	})
	t.Run("client disconnect", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(30 * time.Millisecond)
		srv := httptest.NewServer(New(rdb, WithKeyPrefix(prefix)).ProtectKey(h))
		t.Cleanup(srv.Close)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 20)
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
				require.Eventually(t, func() bool {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
					req.Header.Set(KeyHeader, key)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return false
					}
					resp.Body.Close()
					return resp.StatusCode == http.StatusCreated && resp.Header.Get(ReplayedHeader) == "true"
				}, 10*time.Second, 5*time.Millisecond)
			})
		}
		wg.Wait()
		require.Empty(t, h.doubles())
		require.Equal(t, n, h.executions())
		t.Logf("%d aborted requests: every handler ran to completion once and every retry got its replay", n)
	})
	t.Run("server shutdown", func(t *testing.T) {
		rdb, prefix := reliabilityRedis(t)
		h := newCounting(50 * time.Millisecond)
		other := New(rdb, WithKeyPrefix(prefix)).ProtectKey(h)
		replayed := 0
		for trial := range n / 4 {
			srv := httptest.NewServer(New(rdb, WithKeyPrefix(prefix)).ProtectKey(h))
			before := h.executions()
			var wg sync.WaitGroup
			for i := range 4 {
				key := fmt.Sprintf("shutdown-%d-%d", trial, i)
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{}`))
					req.Header.Set(KeyHeader, key)
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
