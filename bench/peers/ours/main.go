// Command ours serves the side-by-side benchmark's trivial handler behind
// this library in key mode, with a Redis client configured as the
// documentation asks.
package main

import (
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/redis/go-redis/v9"
)

func main() {
	f := peer.ParseFlags(true)
	rdb := redis.NewClient(&redis.Options{Addr: f.Redis, PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	peer.Serve(f, idempotency.New(rdb, idempotency.WithCallerCredentials()).ProtectKey(peer.Handler(f.Instance)), idempotency.ReplayedHeader)
}
