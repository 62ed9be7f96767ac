package e2e

import (
	"context"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
)

// TestBrowser runs every scenario on one shop binary, one redis-server and
// one chromium, which take most of the run's time to start. Each scenario
// starts a shop process of its own on its own Redis database and opens its
// tabs in a fresh browser context, so no cookie, cache entry or order
// crosses from one scenario to the next.
func TestBrowser(t *testing.T) {
	browser := startBrowser(t)
	e := &env{bin: shopproc.Build(t, t.TempDir(), false), redis: redistest.Private(t).Addr(), browser: browser}
	t.Run("clicks", e.testClicks)
	t.Run("back and resubmit", e.testBackAndResubmit)
	t.Run("two tabs", e.testTwoTabs)
	t.Run("fetch client retries", e.testFetchClient)
	t.Run("demo page", e.testDemoPage)
}

// env is what the scenarios share.
type env struct {
	bin     string
	redis   string
	browser context.Context
	dbs     int // Redis databases handed out; a server has 16
}

// shop starts a shop for one scenario on a Redis database of its own.
func (e *env) shop(t *testing.T, environ ...string) *shop {
	e.dbs++
	if e.dbs > 15 {
		t.Fatal("e2e: more scenarios than Redis databases")
	}
	return startShop(t, e.bin, redisURL(e.redis, e.dbs), environ...)
}
