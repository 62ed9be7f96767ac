package client

import (
	"bytes"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// receipt is an answer long enough to be cut after its headers.
var receipt = bytes.Repeat([]byte(`{"paid":500,"ref":"0123456789abcdef"},`), 2500)

// cutting serves a protected payment route whose first answer is cut after
// its headers and its first 2,000 bytes, after the payment ran and its
// answer was stored: over HTTP/1 the connection closes short of its
// Content-Length, over HTTP/2 the stream is reset. It returns the URL to
// post to, the count of payments and a Transport for the Base of a client.
func cutting(t *testing.T, http2 bool) (string, *atomic.Int32, *http.Transport) {
	protected, payments := paymentRoute(t, "test-client-cut-")
	var cut atomic.Bool
	server := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !cut.CompareAndSwap(false, true) {
			protected.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		protected.ServeHTTP(rec, r) // it ran and was stored
		w.Header().Set("Content-Type", rec.Header().Get("Content-Type"))
		w.Header().Set("Trailer", "X-Receipt-Length")
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes()[:2000])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // and the rest is lost
	}))
	start(t, server, http2)
	return server.URL + "/payments", payments, server.Client().Transport.(*http.Transport).Clone()
}

// paymentRoute is a protected payment route on Redis (its keys under
// prefix and the test's name) that answers receipt, with its length as a
// trailer, and counts its payments.
func paymentRoute(t *testing.T, prefix string) (http.Handler, *atomic.Int32) {
	prefix += t.Name()
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix), idempotency.WithCallerCredentials(),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	payments := new(atomic.Int32)
	return idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Trailer", "X-Receipt-Length")
		w.WriteHeader(http.StatusCreated)
		w.Write(receipt)
		w.Header().Set("X-Receipt-Length", strconv.Itoa(len(receipt)))
	})), payments
}

// An answer whose connection fails after its headers came is read to its
// end all the same: the body sends the request again under its key, and
// goes on from the replay of the stored answer. The caller gets the whole
// receipt of the one payment, and its trailers, not an error that would
// make it retry under a new key and pay twice.
func TestTransportResumesAnAnswerCutAfterItsHeaders(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[http2], func(t *testing.T) {
			url, payments, base := cutting(t, http2)
			t.Cleanup(base.CloseIdleConnections)
			rt := &Transport{Base: base, BaseDelay: 1, MaxDelay: 1}
			resp, err := (&http.Client{Transport: rt}).Do(newPost(t, url, `{"amount":500}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Empty(t, resp.Header.Get(ReplayedHeader), "the caller got the first answer's headers")
			require.Equal(t, string(receipt), string(body))
			require.Equal(t, strconv.Itoa(len(receipt)), resp.Trailer.Get("X-Receipt-Length"), "the replay's trailers")
			require.EqualValues(t, 1, payments.Load())
		})
	}
}

// cutAnswer answers receipt's headers and its first 2,000 bytes, then cuts
// the connection; marked replayed when replayed is set.
func cutAnswer(replayed bool) http.HandlerFunc {
	if replayed {
		return cutAfter(2000, ReplayedHeader, "true")
	}
	return cutAfter(2000)
}

// cutAfter answers receipt's headers, with the header name, value, …
// pairs, and its first n bytes, then cuts the connection.
func cutAfter(n int, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(receipt)))
		w.WriteHeader(http.StatusCreated)
		w.Write(receipt[:n])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
}

// The body goes on only from an answer that proves to be the same one;
// anything else leaves the failure for the caller to see, never bytes of
// two answers joined.
func TestTransportResumesOnlyFromTheSameAnswer(t *testing.T) {
	other := bytes.Clone(receipt)
	other[1000] = 'X'
	for _, c := range []struct {
		name  string
		first http.HandlerFunc
		again http.HandlerFunc
		tries int
	}{
		{"not replayed", nil, answerWith(http.StatusCreated, string(receipt)), 2},
		{"another status", nil, answerWith(http.StatusOK, string(receipt), ReplayedHeader, "true"), 2},
		{"other bytes", nil, answerWith(http.StatusCreated, string(other), ReplayedHeader, "true"), 2},
		{"shorter", nil, answerWith(http.StatusCreated, string(receipt[:1000]), ReplayedHeader, "true"), 2},
		{"cut every time", nil, cutAnswer(true), 3},
		// Cut before any byte, the bytes cannot tell: the headers that say
		// how to read them must.
		{"another encoding", cutAfter(0, "Content-Encoding", "gzip"),
			answerWith(http.StatusCreated, string(receipt), ReplayedHeader, "true"), 2},
		{"another type", cutAfter(0, "Content-Type", "application/json"),
			answerWith(http.StatusCreated, string(receipt), ReplayedHeader, "true", "Content-Type", "text/plain"), 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			first, read := c.first, receipt[:0]
			if first == nil {
				first, read = cutAnswer(false), receipt[:2000]
			}
			srv := newScriptedServer(t, first, c.again)
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			rt := fastTransport(t)
			rt.MaxAttempts = 3
			resp, body := postCut(t, rt, srv.URL)
			require.Equal(t, read, body, "the first answer's bytes, and none of another's")
			key := generatedKey(t, srv.seen(), c.tries)
			require.Equal(t, key.String(), resp.Request.Header.Get(KeyHeader), "the key, for a caller that retries by hand")
		})
	}
}

// postCut posts through rt to url and reads the answer's body, whose read
// must fail as cut short; it returns the answer and what was read.
func postCut(t *testing.T, rt *Transport, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := (&http.Client{Transport: rt}).Do(newPost(t, url, `{"amount":500}`))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	body, err := io.ReadAll(resp.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	return resp, body
}

// The attempts that resume a body count against MaxAttempts: a request
// sent once is never resent to resume its answer.
func TestTransportResumesWithinMaxAttempts(t *testing.T) {
	srv := newScriptedServer(t, cutAnswer(false), cutAnswer(true))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	rt := fastTransport(t)
	rt.MaxAttempts = 1
	postCut(t, rt, srv.URL)
	require.Len(t, srv.seen(), 1, "MaxAttempts 1 sends the request once")
}

// A body closed while it resumes ends the request it resent: the reader
// returns at once, not when the server answers.
func TestClosingAResumingBodyEndsItsResend(t *testing.T) {
	stalled, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	srv := newScriptedServer(t, cutAnswer(false), func(w http.ResponseWriter, r *http.Request) {
		close(stalled)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	resp, err := (&http.Client{Transport: fastTransport(t)}).Do(newPost(t, srv.URL, `{"amount":500}`))
	require.NoError(t, err)
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		read <- err
	}()
	<-stalled
	resp.Body.Close()
	select {
	case err := <-read:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the reader still waits for the resent request")
	}
}

// A POST that upgrades the connection gets its body as net/http gives it,
// the connection read and written, not a body that resumes.
func TestAnUpgradedConnectionIsNotWrapped(t *testing.T) {
	srv := newScriptedServer(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		buf := make([]byte, 4)
		if n, err := io.ReadFull(conn, buf); err == nil {
			conn.Write(buf[:n])
		}
	})
	req := newPost(t, srv.URL, "")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := (&http.Client{Transport: fastTransport(t)}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	rw, ok := resp.Body.(io.ReadWriteCloser)
	require.True(t, ok, "the body is the upgraded connection (%T)", resp.Body)
	_, err = io.WriteString(rw, "ping")
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(rw, got)
	require.NoError(t, err)
	require.Equal(t, "ping", string(got))
}
