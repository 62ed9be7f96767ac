package e2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// startBrowser starts a headless chromium for the whole run, or skips the
// test when there is none (fails when IDEMPOTENCY_REQUIRE_BROWSER=1).
func startBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	path := chromiumPath()
	if path == "" {
		if os.Getenv("IDEMPOTENCY_REQUIRE_BROWSER") == "1" {
			t.Fatal("e2e: chromium is not on PATH, and IDEMPOTENCY_REQUIRE_BROWSER=1")
		}
		t.Skip("e2e: chromium is not on PATH (apt-get install chromium); skipping the browser tests")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		// On a machine with no network, background requests only fill the
		// log with refused connections.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(960, 900),
	}
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	t.Cleanup(cancel)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "starting %s", path)
	return browser
}

func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	return ""
}

// newTab opens a tab in a browser context of its own (cookies, cache and
// history start empty), closed when t ends. Its actions time out with t's
// scenario.
func newTab(t *testing.T, browser context.Context) context.Context {
	tab, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(tab))
	return withTimeout(t, tab)
}

// siblingTab opens another tab in the browser context of tab: a user's
// second tab, sharing the first one's cookies.
func siblingTab(t *testing.T, tab context.Context) context.Context {
	sibling, cancel := chromedp.NewContext(tab)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(sibling))
	return withTimeout(t, sibling)
}

func withTimeout(t *testing.T, ctx context.Context) context.Context {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
