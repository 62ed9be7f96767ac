package idempotency

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/require"
)

// Every key the library writes expires: a scan after every kind of request
// (issued, spent, replayed, released, waited on, rejected) finds none
// without a TTL, and a flood of issuance stays capped per session.
func TestEveryKeyHasATTL(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	a, b := newShopOn(t, rdb, WithTokensPerScope(8)), newShopOn(t, rdb, WithTokensPerScope(8))
	c := a.client()
	for range 500 { // a flood of issuance from one session
		a.token(c)
	}
	for i := range 20 {
		tok := a.token(c)
		a.post(c, "/orders", tok, `{}`)
		b.post(c, "/orders", tok, `{}`)
		a.post(c, "/payments", "k-"+strconv.Itoa(i), `{}`)
		a.post(c, "/payments", "k-"+strconv.Itoa(i), `{"other":1}`)
	}
	a.handler = func(w http.ResponseWriter, r *http.Request) { http.Error(w, "x", 500) }
	rel := newShopOn(t, rdb, WithReleaseOnServerError())
	rel.handler = a.handler
	rel.post(c, "/payments", "released", `{}`)
	// A waiter's flag: b waits for a slow execution on a.
	a.handler = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		a.defaultHandler(w, r)
	}
	waited := a.postAsync(c, "/payments", "waited", `{}`)
	time.Sleep(50 * time.Millisecond)
	b.post(c, "/payments", "waited", `{}`)
	(<-waited).must(t)

	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "idem:*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	var forever []string
	for _, k := range keys {
		if rdb.PTTL(ctx, k).Val() < 0 {
			forever = append(forever, k)
		}
	}
	require.Empty(t, forever)
	sets, _ := rdb.Keys(ctx, "idem:*:tokens").Result()
	for _, set := range sets {
		require.LessOrEqual(t, rdb.ZCard(ctx, set).Val(), int64(8), "tokens per session stay capped")
	}
	t.Logf("%d keys after every kind of request, all with a TTL; %d token sets, each at most 8 tokens after 520 issued", len(keys), len(sets))
}

// With Redis full under noeviction, writes fail and the middleware fails
// closed: 503, nothing runs.
func TestRedisOutOfMemoryFailsClosed(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	s := newShopOn(t, rdb)
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "before", `{}`).status)
	ctx := context.Background()
	// A one-byte limit keeps the server over it whatever is freed, so every
	// command that could grow memory is refused from here on.
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
	require.ErrorContains(t, rdb.Set(ctx, "probe", "x", 0).Err(), "OOM")
	for i := range 5 {
		requireProblem(t, s.post(c, "/payments", fmt.Sprint("full-", i), `{}`), http.StatusServiceUnavailable, "store-unavailable")
	}
	resp, err := c.Get(s.srv.URL + "/idempotency/token")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.EqualValues(t, 1, s.execs.Load(), "nothing ran on a full Redis")
}

// A redis-server killed with SIGKILL mid-traffic: requests fail closed, and
// service comes back when a server listens again (on the same port, as a
// supervisor would restart it).
func TestRedisKilledAndRestarted(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	s := newShopOn(t, rdb, WithStoreTimeout(300*time.Millisecond))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "before", `{}`).status)
	require.NoError(t, srv.Signal(syscall.SIGKILL))
	for i := range 3 {
		requireProblem(t, s.post(c, "/payments", fmt.Sprint("down-", i), `{}`), http.StatusServiceUnavailable, "store-unavailable")
	}
	redistest.Restart(t, srv)
	start := time.Now()
	require.Eventually(t, func() bool {
		return s.post(c, "/payments", "after", `{}`).status == http.StatusCreated
	}, 10*time.Second, 10*time.Millisecond)
	t.Logf("service resumed %v after the restarted server listened", time.Since(start))
	require.EqualValues(t, 2, s.execs.Load())
}

// A 100 MiB streamed response passes through while the heap grows by no
// more than the capture cap and a margin; its duplicate gets a problem,
// never part of the body.
func TestLargeStreamedResponseIsNotCaptured(t *testing.T) {
	const total, chunk = 100 << 20, 32 << 10
	s := newShop(t)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, chunk)
		rc := http.NewResponseController(w)
		for sent := 0; sent < total; sent += chunk {
			w.Write(buf)
			if sent%(1<<20) == 0 {
				rc.Flush()
			}
		}
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			mu.Lock()
			peak = max(peak, m.HeapAlloc)
			mu.Unlock()
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
	req.Header.Set(KeyHeader, "stream")
	resp, err := s.client().Do(req)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(done)
	require.NoError(t, err)
	require.EqualValues(t, total, n, "the client got every byte")
	mu.Lock()
	growth := int64(peak) - int64(before.HeapAlloc)
	mu.Unlock()
	limit := int64(1<<20) + 16<<20 // the capture cap plus room for buffers and the race detector
	t.Logf("100 MiB streamed: heap grew by at most %.1f MiB (capture cap 1 MiB)", float64(growth)/(1<<20))
	require.Less(t, growth, limit)
	requireProblem(t, s.post(s.client(), "/payments", "stream", `{}`), http.StatusConflict, "not-replayable")
	require.EqualValues(t, 1, s.execs.Load())
}

// Redis filling up while a handler runs must not lose the handler's answer:
// the store step runs even past maxmemory, and the retry replays it.
func TestAnswerStoredWhenRedisFillsDuringHandler(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	s := newShopOn(t, rdb)
	ctx := context.Background()
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Error(err)
		}
		s.defaultHandler(w, r)
	}
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "filling", `{}`).status)
	st := rdb.HGet(ctx, clientKeys("idem", paymentID("filling")).record, "st").Val()
	require.Equal(t, "done", st, "the answer was stored past maxmemory")
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	other := newShopOn(t, rdb)
	require.Equal(t, "true", other.post(c, "/payments", "filling", `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load()+other.execs.Load())
}
