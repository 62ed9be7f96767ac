package idempotency_test

import (
	"fmt"
	"os"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redisAddr is the Redis the examples dial: the test suite's own server
// (REDIS_URL, else a private redis-server). They share it with the tests
// and other packages' examples, so every example keeps to a key prefix of
// its own under "example:", and what earlier runs left there is deleted
// once per run.
var redisAddr = exampleRedisAddr()

// unreachableAddr is what the examples dial when there is no Redis for
// them: they then fail on their output, as they must, instead of running
// against whatever answers on go-redis's default address, localhost:6379.
const unreachableAddr = "127.0.0.1:0"

func exampleRedisAddr() string {
	opts, err := redistest.SharedOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples: no Redis to run against:", err)
		return unreachableAddr
	}
	// The examples spell out their client options and take only the address
	// from here, so a server that needs more would be reached wrongly (a
	// database other than 0) or not at all.
	if opts.Username != "" || opts.Password != "" || opts.DB != 0 || opts.TLSConfig != nil {
		fmt.Fprintln(os.Stderr, "examples: REDIS_URL needs credentials, a database or TLS; the examples dial a bare address")
		return unreachableAddr
	}
	rdb := redis.NewClient(&redis.Options{Addr: opts.Addr})
	defer rdb.Close()
	if err := redistest.DeleteKeys(rdb, "example:"); err != nil {
		fmt.Fprintln(os.Stderr, "examples: deleting what earlier runs left:", err)
	}
	return opts.Addr
}
