package idempotency_test

import "github.com/onceonly/idempotency/internal/redistest"

// redisAddr is the Redis the examples dial: the test suite's own server
// (REDIS_URL, else a private redis-server). Every example keeps to a key
// prefix of its own under "example:".
var redisAddr = redistest.ExampleAddr("example:")
