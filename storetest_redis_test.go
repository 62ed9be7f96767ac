package idempotency_test

import (
	"strings"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/storetest"
)

// The store conformance kit on Redis: each promise in a key prefix of its
// own on the package's Redis, deleted when the promise's subtest ends.
func TestStoreConformanceRedis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Keyspace {
		prefix := "test-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
		rdb := redistest.Client(t, prefix)
		return func(opts ...idempotency.Option) *idempotency.Middleware {
			return idempotency.New(rdb, append([]idempotency.Option{idempotency.WithKeyPrefix(prefix)}, opts...)...)
		}
	})
}
