package main

import (
	"github.com/onceonly/idempotency/bench/report"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 1024}}

// drive runs conns workers against target until d passes or limit requests
// were sent. target names the base URL and the key of worker w's request i.
func drive(conns int, d time.Duration, limit int, target func(w, i int) (string, string)) report.Result {
	var (
		mu         sync.Mutex
		latencies  []time.Duration
		unexpected int
		sent       int
		wg         sync.WaitGroup
	)
	stop := time.Now().Add(d)
	start := time.Now()
	for w := range conns {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for i := 0; time.Now().Before(stop); i++ {
				mu.Lock()
				if sent >= limit {
					mu.Unlock()
					break
				}
				sent++
				mu.Unlock()
				base, key := target(w, i)
				t0 := time.Now()
				status := postKey(base, key)
				mine = append(mine, time.Since(t0))
				if status != http.StatusCreated {
					bad++
				}
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			unexpected += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	return report.Result{
		Requests: len(latencies), Unexpected: unexpected,
		RPS:   float64(len(latencies)) / elapsed.Seconds(),
		P50ms: pct(0.50), P99ms: pct(0.99),
	}
}

// post sends one protected request and returns its status (0: no answer).
func post(base, key string) int { return postKey(base, key) }

func postKey(base, key string) int {
	req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"item":"tea","quantity":1}`))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
