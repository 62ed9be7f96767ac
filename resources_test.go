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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Every key the library writes expires: a scan after every kind of request
// (issued, spent, replayed, released, waited on, rejected) finds none
// without a TTL, and a flood of issuance writes nothing.
func TestEveryKeyHasATTL(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	a, b := newShopOn(t, rdb), newShopOn(t, rdb)
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
	t.Logf("%d keys after every kind of request, all with a TTL", len(keys))
}

// With Redis full under noeviction, writes fail and the middleware fails
// closed: 503, nothing runs.
func TestRedisOutOfMemoryFailsClosed(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	s := newShopOn(t, rdb)
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "before", `{}`).status)
	token := s.token(c)
	ctx := context.Background()
	// A one-byte limit keeps the server over it whatever is freed, so every
	// command that could grow memory is refused from here on.
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
	require.ErrorContains(t, rdb.Set(ctx, "probe", "x", 0).Err(), "OOM")
	for i := range 5 {
		requireProblem(t, s.post(c, "/payments", fmt.Sprint("full-", i), `{}`), http.StatusServiceUnavailable, "store-unavailable")
	}
	requireProblem(t, s.post(c, "/orders", token, `{}`), http.StatusServiceUnavailable, "store-unavailable")
	s.token(c) // still issued: a token costs Redis nothing until it is spent
	require.EqualValues(t, 1, s.execs.Load(), "nothing ran on a full Redis")
}

// One anonymous client floods the token endpoint far beyond what Redis has
// room for (maxmemory a few MiB above its use, noeviction): every token is
// answered and Redis grows by nothing, so a form whose token was issued
// before the flood still submits once, and a fresh key runs once and
// replays, during the flood and after it.
func TestATokenFloodCannotStarveClaims(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	s := newShopOn(t, rdb)
	legit := s.client()
	formToken := s.token(legit)
	ctx := context.Background()
	used := func() int64 {
		info, err := rdb.Info(ctx, "memory").Result()
		require.NoError(t, err)
		var n int64
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err = strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
			}
		}
		return n
	}
	before := used()
	// 2 MiB of room: at the 218 bytes a stored token used to take, about
	// 9,600 token requests would fill it.
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(before+2<<20, 10)).Err())

	const flood, workers = 30_000, 32
	var answered, refused atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	transport := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(transport.CloseIdleConnections)
	anonymous := &http.Client{Transport: transport, Timeout: 10 * time.Second} // no cookie jar
	deadline := time.Now().Add(60 * time.Second)
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= flood && time.Now().Before(deadline) {
				resp, err := anonymous.Get(s.srv.URL + "/idempotency/token")
				if err != nil {
					refused.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					answered.Add(1)
				} else {
					refused.Add(1)
				}
			}
		})
	}
	during := s.post(s.client(), "/payments", "during-flood", `{}`)
	wg.Wait()
	after := used()
	t.Logf("%d anonymous token requests: %d answered, %d refused; Redis used_memory %d → %d bytes (%+.1f B a request)",
		flood, answered.Load(), refused.Load(), before, after, float64(after-before)/float64(max(answered.Load(), 1)))
	require.Equal(t, http.StatusCreated, during.status, during.body)
	require.Less(t, after-before, int64(1<<20), "the flood wrote nothing to speak of")

	require.Equal(t, http.StatusCreated, s.post(legit, "/orders", formToken, `{}`).status)
	require.Equal(t, "true", s.post(legit, "/orders", formToken, `{}`).header.Get(ReplayedHeader))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "after-flood", `{}`).status)
	require.Equal(t, "true", s.post(c, "/payments", "after-flood", `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 3, s.execs.Load())
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
	st := redistest.RecordState(ctx, rdb, clientKeys("idem", paymentID("filling")).record)
	require.Equal(t, "done", st, "the answer was stored past maxmemory")
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	other := newShopOn(t, rdb)
	require.Equal(t, "true", other.post(c, "/payments", "filling", `{}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load()+other.execs.Load())
}
