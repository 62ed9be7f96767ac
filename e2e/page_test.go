package e2e

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/chromedp/chromedp"
)

// clicks presses the mouse n times, gap apart, on the middle of the
// element sel, as a user's double or triple click does: the pointer stays
// put, each press and release is a click event of its own (carrying the
// click count of a real multi-click), and nothing waits for the page in
// between.
func clicks(sel string, n int, gap time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		// Complete: the style sheet has loaded, so the element is where it
		// will stay and the click lands on it.
		if _, err := waitFor(`document.readyState === 'complete' && !!document.querySelector(`+quote(sel)+`)`)(ctx, t); err != nil {
			return err
		}
		center, err := chromedp.Evaluate[[2]float64](`(() => {
			const el = document.querySelector(`+quote(sel)+`);
			el.scrollIntoView({ block: 'center' });
			const r = el.getBoundingClientRect();
			return [r.x + r.width / 2, r.y + r.height / 2];
		})()`)(ctx, t)
		if err != nil {
			return err
		}
		for i := range n {
			if i > 0 {
				time.Sleep(gap)
			}
			if _, err := chromedp.MouseClickXY(center[0], center[1], chromedp.ClickCount(i+1))(ctx, t); err != nil {
				return err
			}
		}
		return nil
	})
}

// waitFor evaluates the JavaScript predicate in the tab's current page until
// it holds. It asks the page itself, every 25 ms: chromedp's DOM queries
// (WaitVisible and the like) follow a copy of the DOM that a fast redirect
// can leave stale, and then wait forever.
func waitFor(predicate string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for {
			// Between two pages the evaluation fails; that is waiting too.
			if ok, err := chromedp.Evaluate[bool](predicate)(ctx, t); err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", predicate, ctx.Err())
			case <-time.After(25 * time.Millisecond):
			}
		}
	})
}

var (
	onHomePage  = waitFor(`location.pathname === '/' && !!document.querySelector('form.order')`)
	onOrderPage = waitFor(`location.pathname.startsWith('/orders/') && !!document.getElementById('order')`)
)

func quote(s string) string { return strconv.Quote(s) }
