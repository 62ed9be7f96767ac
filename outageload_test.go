package idempotency

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAnOutageAtFullRateLosesNoAnswer drives one instance as fast as this
// machine serves it while Redis refuses connections, or stalls, for a while
// (1 s; 10 s with -long), and proves what the background queue promises:
// every answer a handler gave is stored once Redis is back and the instance
// drained, every request refused was refused with 503 before its handler
// ran and left nothing behind, and no handler ran twice. It logs the rate,
// the refusals and the queue's peak, the figures behind the bounds in
// later.go.
func TestAnOutageAtFullRateLosesNoAnswer(t *testing.T) {
	outage, workers := time.Second, 96
	if *long {
		outage, workers = 10*time.Second, 512
	}
	for _, kind := range []string{"refused", "stalled"} {
		t.Run(kind, func(t *testing.T) { outageAtFullRate(t, kind, outage, workers) })
	}
}

func outageAtFullRate(t *testing.T, kind string, outage time.Duration, workers int) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	m := New(rdb, WithCallerCredentials(), WithLogger(slog.New(slog.DiscardHandler)))

	var runs sync.Map // key → *atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := runs.LoadOrStore(r.Header.Get(KeyHeader), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"status":"created"}`)
	})
	front := httptest.NewServer(m.ProtectKey(handler))
	t.Cleanup(front.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}

	// The load: every worker sends new keys one after the other until told
	// to stop, or a bound is reached.
	type answer struct {
		key    string
		status int
		retry  string
		took   time.Duration
	}
	var (
		stop     atomic.Bool
		sent     atomic.Int64
		answers  = make([][]answer, workers)
		wg       sync.WaitGroup
		maxTotal = int64(400_000)
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stop.Load() && sent.Add(1) <= maxTotal; i++ {
				key := fmt.Sprintf("%s-%d-%d", kind, w, i)
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/orders", strings.NewReader(`{"item":"tea"}`))
				req.Header.Set(KeyHeader, key)
				began := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answers[w] = append(answers[w], answer{key, resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(began)})
			}
		})
	}

	// The queue's peak, sampled.
	var peakJobs, peakBytes int64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling:
				return
			case <-tick.C:
			}
			m.later.mu.Lock()
			peakJobs, peakBytes = max(peakJobs, int64(len(m.later.pending))), max(peakBytes, m.later.bytes)
			m.later.mu.Unlock()
		}
	}()

	phase := func(d time.Duration) int64 {
		before := sent.Load()
		time.Sleep(d)
		return sent.Load() - before
	}
	before := phase(outage / 2)
	switch kind {
	case "refused":
		proxy.Refuse()
	case "stalled":
		srv.Signal(syscall.SIGSTOP)
	}
	during := phase(outage)
	healed := time.Now()
	switch kind {
	case "refused":
		if err := proxy.EndRefuse(); err != nil {
			t.Fatal(err)
		}
	case "stalled":
		srv.Signal(syscall.SIGCONT)
	}
	after := phase(outage / 2)
	stop.Store(true)
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("the drain did not finish: %v", err)
	}
	drained := time.Since(healed)
	close(sampling)
	<-sampled

	// Every answer given is a stored answer; every refusal left nothing.
	// A second instance with no memory of the first checks each key.
	checker := New(rdb, WithCallerCredentials(), WithResponseCache(0, 0)).ProtectKey(handler)
	var created, refused int
	var slowestRefusal time.Duration
	for _, list := range answers {
		for _, a := range list {
			n, ran := runs.Load(a.key)
			switch a.status {
			case http.StatusCreated:
				created++
				if !ran || n.(*atomic.Int32).Load() != 1 {
					t.Errorf("%s: answered 201 with the handler run %v times", a.key, n)
				}
			case http.StatusServiceUnavailable:
				refused++
				slowestRefusal = max(slowestRefusal, a.took)
				if ran {
					t.Errorf("%s: refused with 503 after its handler ran", a.key)
				}
				if a.retry == "" {
					t.Errorf("%s: refused without Retry-After", a.key)
				}
			default:
				t.Errorf("%s: answered %d", a.key, a.status)
				continue
			}
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"tea"}`))
			req.Host = "127.0.0.1" // the key is the host's, as the load sent it
			req.Header.Set(KeyHeader, a.key)
			rec := httptest.NewRecorder()
			checker.ServeHTTP(rec, req)
			replayed := rec.Header().Get(ReplayedHeader) == "true"
			switch {
			case rec.Code != http.StatusCreated:
				t.Errorf("%s (first answered %d): its retry answered %d %s", a.key, a.status, rec.Code, rec.Body)
			case a.status == http.StatusCreated && !replayed:
				t.Errorf("%s: its answer was lost: the retry ran the handler again", a.key)
			case a.status == http.StatusServiceUnavailable && replayed:
				t.Errorf("%s: refused, yet a stored answer replays", a.key)
			}
			if t.Failed() && created+refused > 20 {
				t.FailNow()
			}
		}
	}
	rate := func(n int64, d time.Duration) string {
		return strconv.FormatInt(int64(float64(n)/d.Seconds()), 10) + " req/s"
	}
	t.Logf("%s for %v, %d workers: %s before, %s during, %s after; %d answered 201, %d refused 503; "+
		"the slowest refusal took %v; queue peak %d jobs, %d bytes of answers; drained %v after Redis was back",
		kind, outage, workers, rate(before, outage/2), rate(during, outage), rate(after, outage/2),
		created, refused, slowestRefusal.Round(time.Millisecond), peakJobs, peakBytes, drained.Round(time.Millisecond))
	if peakJobs > laterJobs+int64(workers) || peakBytes > laterBytes {
		t.Errorf("the queue outgrew its bounds: %d jobs, %d bytes", peakJobs, peakBytes)
	}
}
