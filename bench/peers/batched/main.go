// Command batched serves the side-by-side benchmark's trivial handler
// behind this library in key mode with WithAutoPipeline, which sends the
// scripts of concurrent requests through go-redis's AutoPipeliner.
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
	h := idempotency.New(rdb, idempotency.WithAutoPipeline()).ProtectKey(peer.Handler(f.Instance))
	peer.Serve(f, h, idempotency.ReplayedHeader)
}
