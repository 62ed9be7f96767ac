package stacktest

import (
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var discardLog = log.New(io.Discard, "", 0)

// A protocol serves a handler and gives a client for it.
type protocol struct {
	name  string
	serve func(t *testing.T, h http.Handler) (string, *http.Client)
}

var protocols = []protocol{
	{"HTTP/1.1", func(t *testing.T, h http.Handler) (string, *http.Client) {
		srv := start(t, h, func(srv *httptest.Server) { srv.Start() })
		// A connection per request: a handler that broke its own
		// Content-Length leaves its connection to close, and a request
		// sent on it meanwhile would be reset.
		return srv.URL, client(t, &http.Transport{DisableKeepAlives: true})
	}},
	{"HTTP/2 over TLS", func(t *testing.T, h http.Handler) (string, *http.Client) {
		srv := start(t, h, func(srv *httptest.Server) { srv.EnableHTTP2 = true; srv.StartTLS() })
		return srv.URL, client(t, srv.Client().Transport.(*http.Transport).Clone())
	}},
	{"h2c", func(t *testing.T, h http.Handler) (string, *http.Client) {
		srv := start(t, h, func(srv *httptest.Server) {
			srv.Config.Protocols = new(http.Protocols)
			srv.Config.Protocols.SetHTTP1(true)
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
			srv.Start()
		})
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return srv.URL, client(t, tr)
	}},
}

func start(t *testing.T, h http.Handler, run func(*httptest.Server)) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = discardLog
	run(srv)
	t.Cleanup(srv.Close)
	return srv
}

func client(t *testing.T, tr *http.Transport) *http.Client {
	tr.DisableCompression = true // the bytes as sent, and Accept-Encoding as the test sets it
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// stack serves every handler case, each on a path of its own, with the
// layer around it, protected by m (nil: without the middleware).
func stack(t *testing.T, l layer, m *idempotency.Middleware) http.Handler {
	mux := http.NewServeMux()
	for i, hc := range handlers {
		serve := hc.serve
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read, as handlers do: net/http may reset a connection whose
			// request was not read, which would be the test's noise.
			io.Copy(io.Discard, r.Body)
			serve(w, r)
		})
		if l.inner != nil {
			h = l.inner(t, m, h)
		}
		if m != nil {
			h = m.ProtectKey(h)
		}
		mux.Handle("/"+strconv.Itoa(i), h)
	}
	if l.outer != nil {
		return l.outer(t, mux)
	}
	return mux
}

// A reply is an answer as a client sees it.
type reply struct {
	Status  int
	Header  http.Header // Date aside
	Body    string
	Trailer http.Header
	Early   []string // informational answers
	Failed  bool     // no answer, or one that broke off
}

// send sends one request with the given headers (name, value, …).
func send(t *testing.T, c *http.Client, method, url string, header ...string) reply {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"amount":500}`)
	}
	var got reply
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		got.Early = append(got.Early, fmt.Sprint(code, " ", h))
		return nil
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), method, url, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i < len(header); i += 2 {
		// Set as written: net/http's client resends on its own a request
		// whose Idempotency-Key is set canonically, and the test counts
		// attempts itself.
		req.Header[strings.ToLower(header[i])] = []string{header[i+1]}
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{Failed: true}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	got.Status, got.Header, got.Body, got.Failed = resp.StatusCode, resp.Header, string(b), err != nil
	if got.Failed {
		got.Body = "" // how much came before the break is the network's
	}
	got.Header.Del("Date")
	for name, values := range resp.Trailer {
		if len(values) > 0 {
			if got.Trailer == nil {
				got.Trailer = http.Header{}
			}
			got.Trailer[name] = values
		}
	}
	return got
}

// expectation is what a duplicate of hc's request gets behind l.
func expectation(l layer, hc handlerCase) expect {
	switch {
	case hc.dup == passed:
		return passed
	case hc.name == "Content-Length too large" && l.name == "ReverseProxy to a compressing upstream":
		return replayed // the upstream sent the answer it had, with its length
	case hc.streams && l.cannotFlush:
		return replayed // a flush that flushed nothing is no streaming
	case hc.name == "larger than the limit" && l.compresses:
		return replayed // the limit is on what the recorder sees: compressed, small
	}
	return hc.dup
}

// The first caller gets exactly what the same stack without the
// middleware sends, and a duplicate gets the answer the stack without it
// would send to the duplicate's own request, marked replayed (or the
// problem that says why it cannot be replayed).
func TestTheMiddlewareIsInvisible(t *testing.T) {
	began, compared := time.Now(), 0
	for _, l := range layers {
		for _, p := range protocols {
			t.Run(l.name+"/"+p.name, func(t *testing.T) {
				prefix := "stack-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
				m := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
					idempotency.WithMaxResponseBytes(limit), idempotency.WithLogger(slog.New(slog.DiscardHandler)))
				withURL, with := p.serve(t, stack(t, l, m))
				bareURL, bare := p.serve(t, stack(t, l, nil))
				for i, hc := range handlers {
					path := "/" + strconv.Itoa(i)
					negotiated := []string{idempotency.KeyHeader, "k" + path, "Accept-Encoding", "gzip", "Origin", "https://a.example"}
					plain := []string{idempotency.KeyHeader, "k" + path, "Origin", "https://b.example"}
					want := send(t, bare, hc.method, bareURL+path, negotiated...)
					got := send(t, with, hc.method, withURL+path, negotiated...)
					first := got
					if hc.overruns && want.Failed {
						// HTTP/2 without the middleware sends past the length
						// and the client refuses the answer; the middleware
						// refuses the write, as HTTP/1 does.
						if got.Failed || got.Body != "hello" {
							t.Errorf("%s: the first answer: want hello, got %s", hc.name, got)
						}
					} else {
						same(t, want, got, "%s: the first answer", hc.name)
					}
					for _, header := range [][]string{negotiated, plain} {
						want := send(t, bare, hc.method, bareURL+path, header...)
						got := send(t, with, hc.method, withURL+path, header...)
						compared++
						switch expectation(l, hc) {
						case passed:
							same(t, want, got, "%s: a duplicate passes", hc.name)
						case notReplayable:
							if got.Status != http.StatusConflict || !strings.Contains(got.Body, idempotency.ProblemTypeBase+"not-replayable") {
								t.Errorf("%s: a duplicate: want 409 not-replayable, got %s", hc.name, got)
							}
						case replayed:
							if hc.name == "103 then 201" && l.takes1xx {
								// The layer sent the 103 as the final status the
								// first time; a replay has no 103 to send.
								if got.Status != http.StatusCreated || got.Header.Get(idempotency.ReplayedHeader) != "true" {
									t.Errorf("%s: a duplicate: want the handler's 201 replayed, got %s", hc.name, got)
								}
								continue
							}
							if l.compresses && header[2] != "Accept-Encoding" {
								// The stored answer is the first one, compressed by the
								// inner layer; a duplicate that does not accept gzip
								// gets it decoded.
								want = decoded(t, first)
								got.Header = got.Header.Clone()
								got.Header.Del("Content-Length") // net/http's choice, by the body's size
								if want.Header.Get("Content-Type") == "" {
									// net/http sniffs one for a body sent without a coding.
									got.Header.Del("Content-Type")
								}
							}
							if hc.overruns && want.Failed {
								want = reply{Status: http.StatusOK, Header: got.Header, Body: "hello"}
							}
							want.Early = nil // informational answers are not replayed
							if want.Header == nil {
								want.Header = http.Header{}
							}
							want.Header = want.Header.Clone()
							want.Header.Set(idempotency.ReplayedHeader, "true")
							same(t, want, got, "%s: a duplicate with %q", hc.name, header)
						}
					}
				}
			})
		}
	}
	t.Logf("%d layers × %d protocols × %d handlers, %d duplicates compared, in %v",
		len(layers), len(protocols), len(handlers), compared, time.Since(began).Round(time.Millisecond))
}

// same reports a difference between two replies, briefly.
func same(t *testing.T, want, got reply, format string, args ...any) {
	t.Helper()
	if w, g := want.String(), got.String(); w != g {
		t.Errorf(format+":\n want %s\n  got %s", append(args, w, g)...)
	}
}

// String shows a reply with its headers in order, and its body digested.
func (r reply) String() string {
	if r.Failed && r.Status == 0 {
		return "failed"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d failed=%t early=%q", r.Status, r.Failed, r.Early)
	for _, h := range []http.Header{r.Header, r.Trailer} {
		names := make([]string, 0, len(h))
		for name := range h {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			fmt.Fprintf(&b, " %s=%q", name, h[name])
		}
		b.WriteString(" |")
	}
	body := r.Body
	if len(body) > 40 {
		body = fmt.Sprintf("%.20q… (%d bytes, %x)", body, len(body), sha256.Sum256([]byte(body)))
		body = body[:min(len(body), 90)]
	} else {
		body = strconv.Quote(body)
	}
	return b.String() + " body " + body
}

// decoded is r with its body gzip-decoded, as a replay sends it to a
// request that does not accept gzip.
func decoded(t *testing.T, r reply) reply {
	t.Helper()
	r.Header = r.Header.Clone()
	r.Header.Del("Content-Length")
	r.Early = nil
	if r.Header.Get("Content-Encoding") != "gzip" {
		return r
	}
	zr, err := gzip.NewReader(strings.NewReader(r.Body))
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	r.Body = string(b)
	r.Header.Del("Content-Encoding")
	return r
}
