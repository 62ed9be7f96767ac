// Package e2e drives the example shop in a real browser: Debian's chromium,
// headless, through chromedp. Each scenario clicks, navigates or fetches as
// a user or a script would, then counts what reached the back end with GET
// /orders or GET /payments.
//
// The shop runs as its own process (the binary `go run ./example` builds),
// on a free loopback port, against a private redis-server. Without chromium
// the tests skip, unless IDEMPOTENCY_REQUIRE_BROWSER=1 (scripts/test.sh sets
// it). UPDATE_SCREENSHOT=1 rewrites docs/demo.png from the run.
package e2e

import (
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
