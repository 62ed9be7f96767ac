package client

import (
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// losing serves a protected payment route whose first answer is lost after
// the payment ran and its answer was stored: the connection to the server
// is aborted. Behind httputil.ReverseProxy the client gets a 502; over
// HTTP/2 with no proxy, the stream reset with INTERNAL_ERROR that a front
// proxy sends for the same loss. It returns the URL to post to, the count
// of payments and a Transport for the Base of a client.
func losing(t *testing.T, proxied bool) (string, *atomic.Int32, *http.Transport) {
	prefix := "test-client-lost-" + t.Name()
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	payments := new(atomic.Int32)
	protected := idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"paid":500}`)
	}))
	var lost atomic.Bool
	server := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lost.CompareAndSwap(false, true) {
			protected.ServeHTTP(httptest.NewRecorder(), r) // it ran and was stored; the answer goes nowhere
			panic(http.ErrAbortHandler)                    // and the connection is cut
		}
		protected.ServeHTTP(w, r)
	}))
	server.Config.ErrorLog = log.New(io.Discard, "", 0)
	if proxied {
		server.Start()
		t.Cleanup(server.Close)
		target, err := url.Parse(server.URL)
		require.NoError(t, err)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.ErrorLog = log.New(io.Discard, "", 0)
		gateway := httptest.NewServer(proxy)
		t.Cleanup(gateway.Close)
		return gateway.URL + "/payments", payments, http.DefaultTransport.(*http.Transport).Clone()
	}
	server.EnableHTTP2 = true
	server.StartTLS()
	t.Cleanup(server.Close)
	return server.URL + "/payments", payments, server.Client().Transport.(*http.Transport).Clone()
}

// An answer lost between a gateway and the server (a 502, or an HTTP/2
// reset with INTERNAL_ERROR) is fetched again with the same key: the
// caller gets the stored answer of the one payment, not an error that
// would make it retry with a new key and pay twice.
func TestTransportFetchesAnAnswerTheGatewayLost(t *testing.T) {
	for _, proxied := range []bool{true, false} {
		name := "HTTP/2 reset"
		if proxied {
			name = "502 of httputil.ReverseProxy"
		}
		t.Run(name, func(t *testing.T) {
			url, payments, base := losing(t, proxied)
			t.Cleanup(base.CloseIdleConnections)
			rt := &Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}
			code, header, body := postTo(t, rt, newPost(t, url, `{"amount":500}`))
			require.Equal(t, http.StatusCreated, code, body)
			require.Equal(t, "true", header.Get(ReplayedHeader))
			require.Equal(t, `{"paid":500}`, body)
			require.EqualValues(t, 1, payments.Load())
		})
	}
}

// A timeout outside the protection (http.TimeoutHandler, as design.md
// advises) answers 503 while the handler goes on and stores its answer:
// the retry, under the same key, gets that answer replayed, where the
// caller's own retry would take a new key and pay again.
func TestTransportFetchesAnAnswerATimeoutOutsideGaveUpOn(t *testing.T) {
	prefix := "test-client-timeout-" + t.Name()
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	var payments atomic.Int32
	slow := idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		payments.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"paid":500}`)
	}))
	srv := httptest.NewServer(http.TimeoutHandler(slow, 100*time.Millisecond, "timed out"))
	t.Cleanup(srv.Close)
	rt := fastTransport(t)
	// Retries inside the run are cut short by the timeout too: enough of
	// them to outlast the handler on a busy machine (at least 3 s).
	rt.MaxAttempts = 30
	code, header, body := postTo(t, rt, newPost(t, srv.URL+"/payments", `{"amount":500}`))
	require.Equal(t, http.StatusCreated, code, body)
	require.Equal(t, "true", header.Get(ReplayedHeader))
	require.Equal(t, `{"paid":500}`, body)
	require.EqualValues(t, 1, payments.Load())
}
