// Command ours serves the side-by-side benchmark's trivial handler behind
// this library in key mode, with a Redis client configured as the
// documentation asks; -autopipeline adds WithAutoPipeline, which sends the
// scripts of concurrent requests through go-redis's AutoPipeliner.
package main

import (
	"flag"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/redis/go-redis/v9"
)

func main() {
	autopipeline := flag.Bool("autopipeline", false, "send the scripts through go-redis's AutoPipeliner")
	f := peer.ParseFlags(true)
	rdb := redis.NewClient(&redis.Options{Addr: f.Redis, PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	var opts []idempotency.Option
	if *autopipeline {
		opts = append(opts, idempotency.WithAutoPipeline())
	}
	peer.Serve(f, idempotency.New(rdb, opts...).ProtectKey(peer.Handler(f.Instance)), idempotency.ReplayedHeader)
}
