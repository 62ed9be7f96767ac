package idempotency_test

import (
	"sync"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var exampleServer struct {
	once sync.Once
	opts *redis.Options
}

// exampleOptions points the examples at the package's test Redis, deleting
// what earlier runs of the examples left so each run starts from nothing.
func exampleOptions() *redis.Options {
	exampleServer.once.Do(func() {
		opts, err := redistest.SharedOptions()
		if err != nil {
			panic(err)
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		if err := redistest.DeleteKeys(rdb, "example-"); err != nil {
			panic(err)
		}
		exampleServer.opts = opts
	})
	return exampleServer.opts
}
