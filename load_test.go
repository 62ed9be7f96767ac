package idempotency

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A bounded load on loopback: two instances behind one Redis, one in ten
// requests a duplicate of a recent key (some of them while the original
// still runs, some on the other instance). No key may run twice, and every
// answer must be a 201 (executed or replayed) or a 409 while in progress.
func TestLoadTwoInstancesWithDuplicates(t *testing.T) {
	duration := 5 * time.Second
	if *long {
		duration = 30 * time.Second
	}
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	h := newCounting(2 * time.Millisecond)
	instances := []*httptest.Server{
		httptest.NewServer(New(rdb, WithCallerCredentials()).ProtectKey(h)),
		httptest.NewServer(New(rdb, WithCallerCredentials()).ProtectKey(h)),
	}
	for _, s := range instances {
		t.Cleanup(s.Close)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	const workers = 16
	var (
		mu        sync.Mutex
		latencies []time.Duration
		statuses  = map[int]int{}
		wg        sync.WaitGroup
	)
	stop := time.Now().Add(duration)
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			mineStatus := map[int]int{}
			for i := 0; time.Now().Before(stop) && i < 200_000; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				if i%10 == 9 {
					// A duplicate: of this worker's previous request (just
					// finished) or of another worker's (maybe still running).
					key = fmt.Sprintf("w%d-%d", (w+i)%workers, i-1)
				}
				req, _ := http.NewRequest(http.MethodPost, instances[i%2].URL+"/payments", strings.NewReader(`{}`))
				req.Header.Set(KeyHeader, key)
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					mineStatus[0]++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(start))
				mineStatus[resp.StatusCode]++
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			for k, v := range mineStatus {
				statuses[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(latencies)
	p := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
	t.Logf("%v of load, %d workers, 2 instances: %d requests (%.0f req/s), %d executions, statuses %v, p50 %v, p99 %v",
		duration, workers, len(latencies), float64(len(latencies))/duration.Seconds(), h.executions(), statuses,
		p(0.50).Round(time.Microsecond), p(0.99).Round(time.Microsecond))
	require.Empty(t, h.doubles(), "no key ran twice")
	for status := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, status, "unexpected status")
	}
}
