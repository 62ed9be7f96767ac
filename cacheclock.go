package idempotency

import (
	"time"

	"github.com/onceonly/idempotency/internal/cacheclock"
)

// The response cache reads the time through config.cacheClock, which only
// idemtest sets: its in-process Redis's clock moves with FastForward, and
// the cache must not outlive the records it stands for.
func init() {
	cacheclock.Option = func(now func() time.Time) any {
		return Option(func(c *config) { c.cacheClock = now })
	}
}
