// Command load measures what the middleware costs under load, on loopback:
// it starts a private redis-server, two instances of a protected handler
// sharing it, and drives them with a fixed number of connections for a
// fixed time per workload, then prints req/s and latency percentiles and
// writes them as JSON for bench/chart.
//
//	go run ./bench/load -duration 5s -conns 16 -out bench/results.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"github.com/onceonly/idempotency/bench/report"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long each workload runs")
	conns := flag.Int("conns", 16, "concurrent connections")
	maxRequests := flag.Int("max-requests", 2_000_000, "stop a workload after this many requests")
	out := flag.String("out", "", "write the results as JSON to this file")
	flag.Parse()
	if *duration <= 0 || *duration > 5*time.Minute || *conns < 1 || *conns > 1024 {
		log.Fatal("load: -duration must be in (0, 5m] and -conns in [1, 1024]")
	}

	srv, err := redistest.StartServer()
	if err != nil {
		log.Fatalf("load: %v", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()

	a := idempotency.New(rdb, idempotency.WithKeyPrefix("load"), idempotency.WithCallerCredentials())
	// The second instance keeps no responses in memory, so that its
	// duplicates measure the Redis replay path.
	b := idempotency.New(rdb, idempotency.WithKeyPrefix("load"), idempotency.WithCallerCredentials(), idempotency.WithResponseCache(0, 0))
	bare := serve(http.HandlerFunc(handler))
	instA := serve(a.ProtectKey(http.HandlerFunc(handler)))
	instB := serve(b.ProtectKey(http.HandlerFunc(handler)))

	// One completed key for the duplicate workloads.
	if status := post(instA, "warm"); status != http.StatusCreated {
		log.Fatalf("load: warm-up answered %d", status)
	}

	rep := report.Report{
		Machine:  machine(),
		Duration: duration.String(),
		Conns:    *conns,
	}
	run := func(name, what string, target func(worker, i int) (string, string)) {
		// An unrecorded second first: connections, pools and caches warm up.
		drive(*conns, time.Second, *maxRequests, func(w, i int) (string, string) {
			base, key := target(w, i)
			if key != "" && key != "warm" {
				key = "warm-up-" + key
			}
			return base, key
		})
		r := drive(*conns, *duration, *maxRequests, target)
		r.Name, r.What = name, what
		rep.Results = append(rep.Results, r)
		fmt.Printf("%-18s %9.0f req/s  p50 %7.3f ms  p99 %7.3f ms  %d requests, %d unexpected  (%s)\n",
			r.Name, r.RPS, r.P50ms, r.P99ms, r.Requests, r.Unexpected, r.What)
	}
	run("bare", "the handler alone", func(w, i int) (string, string) { return bare, "" })
	run("first", "a new key per request", func(w, i int) (string, string) {
		return instA, "first-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
	})
	run("dup-same", "one completed key, same instance (in-process cache)", func(w, i int) (string, string) {
		return instA, "warm"
	})
	run("dup-cross", "one completed key, other instance (replay from Redis)", func(w, i int) (string, string) {
		return instB, "warm"
	})
	run("mixed-90-10", "90% new keys, 10% repeats of recent ones, both instances", func(w, i int) (string, string) {
		inst := []string{instA, instB}[i%2]
		if i%10 == 9 {
			return inst, "mixed-" + strconv.Itoa(w) + "-" + strconv.Itoa(i-9)
		}
		return inst, "mixed-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
	})

	if *out != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			log.Fatalf("load: %v", err)
		}
	}
}

var response = []byte(`{"id":1,"status":"created"}`)

func handler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(response)
}

// serve starts h on a free loopback port and returns its base URL.
func serve(h http.Handler) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("load: %v", err)
	}
	go http.Serve(l, h)
	return "http://" + l.Addr().String()
}

func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, %d cores, %s (server, Redis and load generator share them)", host, runtime.NumCPU(), runtime.Version())
}
