package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// testDemoPage uses the demo page as a visitor would: an order placed with
// a double click and one with a single click, then the button that sends
// one payment twice through idempotent-fetch.js, whose second answer the
// page marks as replayed. With UPDATE_SCREENSHOT=1 the page as it ends up
// is docs/demo.png.
func (e *env) testDemoPage(t *testing.T) {
	s := e.shop(t, "ORDER_LATENCY="+orderLatency.String())
	tab := newTab(t, e.browser)

	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(s.URL+"/"), onHomePage))
	for i, item := range []string{"Green tea", "Oolong"} {
		require.NoError(t, chromedp.Do(tab,
			chromedp.Evaluate[chromedp.Void](`document.getElementById('item').value = `+quote(item))))
		if i == 0 {
			multiClick(t, tab, 2)
		} else {
			require.NoError(t, chromedp.Do(tab, clicks(submit, 1, 0), onOrderPage))
		}
		text, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.innerText`))
		require.NoError(t, err)
		require.Contains(t, text, "1 × "+item)
		require.Contains(t, text, "just now")
		require.NoError(t, chromedp.Do(tab, clicks(`a[href="/"]`, 1, 0), onHomePage))
	}
	count, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById('order-count').textContent`))
	require.NoError(t, err)
	require.Equal(t, "2", count)

	require.NoError(t, chromedp.Do(tab,
		waitFor(`!document.getElementById('pay').disabled`), // its script has loaded
		clicks(`#pay`, 1, 0),
		waitFor(`document.querySelectorAll('#answers li').length === 2`),
	))
	answers, err := chromedp.Run(tab, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('#answers li')].map(li => li.innerText)`))
	require.NoError(t, err)
	require.Regexp(t, `^201 payment [0-9a-f]{16} captured$`, answers[0])
	require.Equal(t, answers[0]+" replayed", answers[1], "the second answer is the first, replayed")
	require.Equal(t, 1, s.count(t, "/payments"))
	require.Equal(t, 2, s.count(t, "/orders"))

	// A short viewport makes the full-page shot as tall as the content.
	require.NoError(t, chromedp.Do(tab, chromedp.EmulateViewport(900, 400)))
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		require.NoError(t, os.WriteFile(filepath.Join("..", "docs", "demo.png"), png, 0o644))
		t.Log("wrote docs/demo.png")
	}
}
