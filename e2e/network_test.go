package e2e

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/onceonly/idempotency"
	"github.com/stretchr/testify/require"
)

// requestLog records the requests a tab sends, redirects included.
type requestLog struct {
	mu     sync.Mutex
	events []*network.EventRequestWillBeSent
}

func logRequests(t *testing.T, tab context.Context) *requestLog {
	l := &requestLog{}
	require.NoError(t, chromedp.Listen(tab, func(ev any) {
		// Called in the tab's event loop: record and return.
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
		}
	}))
	return l
}

// sent returns the requests for method and path, in order.
func (l *requestLog) sent(method, path string) []*network.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*network.Request
	for _, e := range l.events {
		if u, err := url.Parse(e.Request.URL); err == nil && e.Request.Method == method && u.Path == path {
			out = append(out, e.Request)
		}
	}
	return out
}

// redirects returns the redirect answers the tab followed, in order.
func (l *requestLog) redirects() []*network.Response {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*network.Response
	for _, e := range l.events {
		if e.RedirectResponse != nil {
			out = append(out, e.RedirectResponse)
		}
	}
	return out
}

// replayed reports whether an answer was the stored one, replayed.
func replayed(r *network.Response) bool {
	for k, v := range r.Headers {
		if strings.EqualFold(k, idempotency.ReplayedHeader) {
			return v == "true"
		}
	}
	return false
}

// formField returns a field of a form body the tab sent.
func formField(t *testing.T, r *network.Request, name string) string {
	t.Helper()
	var body strings.Builder
	for _, e := range r.PostDataEntries {
		body.Write(e.Bytes)
	}
	values, err := url.ParseQuery(body.String())
	require.NoError(t, err)
	return values.Get(name)
}

// header returns a request header the tab sent, whatever its case.
func header(r *network.Request, name string) string {
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			s, _ := v.(string)
			return s
		}
	}
	return ""
}

// pauseRequests turns on Chrome's request interception in tab for the
// patterns and hands each paused request to handle, one at a time, until t
// ends. A request stays paused until handle (or someone) continues, fulfils
// or fails it.
func pauseRequests(t *testing.T, tab context.Context, patterns []*fetch.RequestPattern,
	handle func(context.Context, fetch.EventRequestPaused) error) {
	ctx, stop := context.WithCancel(tab)
	paused := chromedp.Events(ctx, fetch.RequestPaused) // subscribed before Enable: no event is missed
	_, err := chromedp.Call(tab, fetch.Enable, fetch.EnableParams{Patterns: patterns})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev, err := range paused {
			if err != nil {
				return // the tab is closing
			}
			if err := handle(ctx, ev); err != nil && ctx.Err() == nil {
				t.Errorf("e2e: handling the paused %s %s: %v", ev.Request.Method, ev.Request.URL, err)
			}
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
}

// An answerHold keeps the answers to a tab's requests from the page until
// released, like a slow network. The shop gets and runs each request at
// once; only the page waits. A multi-click then lands on the form every
// time, however slow the machine, since the page cannot navigate before the
// test has clicked for the last time and released the answers.
type answerHold struct {
	mu       sync.Mutex
	released bool
	held     []fetch.RequestID
}

func holdAnswers(t *testing.T, tab context.Context, path string) *answerHold {
	h := &answerHold{}
	pauseRequests(t, tab, []*fetch.RequestPattern{{URLPattern: "*" + path, RequestStage: fetch.RequestStageResponse}},
		func(ctx context.Context, ev fetch.EventRequestPaused) error {
			h.mu.Lock()
			if !h.released {
				h.held = append(h.held, ev.RequestID)
				h.mu.Unlock()
				return nil
			}
			h.mu.Unlock()
			letAnswerThrough(ctx, ev.RequestID)
			return nil
		})
	return h
}

// release lets the held answers and every later one through.
func (h *answerHold) release(tab context.Context) {
	h.mu.Lock()
	h.released = true
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, id := range held {
		letAnswerThrough(tab, id)
	}
}

// letAnswerThrough continues a paused answer. The page may have given up
// on its request meanwhile (a later click aborted it); that answer is
// simply gone, which is no error here.
func letAnswerThrough(ctx context.Context, id fetch.RequestID) {
	chromedp.Call(ctx, fetch.ContinueResponse, fetch.ContinueResponseParams{RequestID: id})
}
