// Command serve starts a private redis-server and one protected instance of
// a trivial handler on loopback, and keeps them up for a bounded time, so
// that an external load generator (wrk, as the peers in the README were
// measured with) can drive it.
//
//	go run ./bench/serve -for 30s &
//	wrk -t1 -c16 -d6s -s bench/serve/newkey.lua http://127.0.0.1:18090/payments
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18090", "loopback address to listen on")
	lifetime := flag.Duration("for", 30*time.Second, "how long to serve before stopping")
	flag.Parse()
	if *lifetime <= 0 || *lifetime > 10*time.Minute {
		log.Fatal("serve: -for must be in (0, 10m]")
	}
	srv, err := redistest.StartServer()
	if err != nil {
		log.Fatalf("serve: %v", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithCallerCredentials())
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1,"status":"created"}`))
	})))
	server := &http.Server{Addr: *addr, Handler: mux}
	go func() {
		time.Sleep(*lifetime)
		server.Close()
	}()
	log.Printf("serve: protected handler on http://%s/payments for %v (Redis %s)", *addr, *lifetime, srv.Addr())
	if err := server.ListenAndServe(); err != http.ErrServerClosed {
		log.Printf("serve: %v", err)
	}
}
