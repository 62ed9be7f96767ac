package idempotency

import (
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// The recorder stores what went out with the status, and nothing else.
func TestRecorderStoresWhatWasSent(t *testing.T) {
	t.Run("headers set after the status", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.Header().Set("X-Before", "sent")
		rw.WriteHeader(http.StatusCreated)
		rw.Header().Set("X-After", "never sent")
		rec := rw.finish()
		require.Equal(t, []string{"X-Before", "sent"}, rec.header)
		require.Empty(t, w.Result().Header.Get("X-After"))
	})
	t.Run("trailers reach the client", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rw := newRecorder(w, 1<<20, keepAll)
			rw.Header().Set("Trailer", "X-Sum")
			rw.WriteHeader(http.StatusOK)
			rw.Write([]byte("body"))
			rw.Header().Set("X-Sum", "42")
			rw.Header().Set(http.TrailerPrefix+"X-Late", "yes")
			rw.finish()
		}))
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "42", resp.Trailer.Get("X-Sum"))
		require.Equal(t, "yes", resp.Trailer.Get("X-Late"))
	})
	t.Run("a failed hijack changes nothing", func(t *testing.T) {
		w := httptest.NewRecorder() // cannot hijack
		rw := newRecorder(w, 1<<20, keepAll)
		_, _, err := rw.Hijack()
		require.Error(t, err)
		rw.Header().Set("Content-Type", "text/plain")
		rw.WriteHeader(http.StatusInternalServerError)
		rw.Write([]byte("no hijack here"))
		rec := rw.finish()
		require.NotNil(t, rec, "an ordinary answer stays replayable")
		require.Equal(t, "text/plain", w.Header().Get("Content-Type"))
	})
	t.Run("a header withdrawn after early hints", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.Header().Set("Link", "</style.css>; rel=preload")
		rw.WriteHeader(http.StatusEarlyHints)
		rw.Header().Del("Link")
		rw.WriteHeader(http.StatusOK)
		require.Empty(t, w.Header().Get("Link"))
		require.Empty(t, rw.finish().header)
	})
	t.Run("no body where none is allowed", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.WriteHeader(http.StatusNoContent)
		rw.Write([]byte("ignored"))
		require.Empty(t, rw.finish().body)
	})
	t.Run("switching protocols is not replayable", func(t *testing.T) {
		rw := newRecorder(httptest.NewRecorder(), 1<<20, keepAll)
		rw.WriteHeader(http.StatusSwitchingProtocols)
		require.Nil(t, rw.finish())
	})
}

// abandonFirstPost sends a POST on a raw connection and closes it without
// reading the answer, as a browser that aborts its first submit does.
func abandonFirstPost(t *testing.T, srvURL, path, key, body string) {
	t.Helper()
	u, err := url.Parse(srvURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, srvURL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(KeyHeader, key)
	require.NoError(t, req.Write(conn))
	require.NoError(t, conn.Close())
}

// A handler that goes on after its client left writes into a dead
// connection; the answer stored for the retry is still the whole answer.
func TestClientGoneMidBodyStoresTheWholeAnswer(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 400<<10/16) // 400 KiB
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter) error
	}{
		{"io.Copy", func(w http.ResponseWriter) error {
			_, err := io.Copy(w, io.LimitReader(bytes.NewReader(big), int64(len(big)))) // 32 KiB writes
			return err
		}},
		{"loop of small writes", func(w http.ResponseWriter) error {
			for i := 0; i < len(big); i += 1000 {
				if _, err := w.Write(big[i:min(i+1000, len(big))]); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t)
			var handlerErr atomic.Value
			finished := make(chan struct{})
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				defer close(finished)
				time.Sleep(200 * time.Millisecond) // the client is gone by now
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(http.StatusCreated)
				if err := tc.write(w); err != nil {
					handlerErr.Store(err)
				}
			}
			abandonFirstPost(t, s.srv.URL, "/payments", "gone", `{}`)
			select {
			case <-finished:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler did not finish")
			}
			require.Nil(t, handlerErr.Load(), "the handler's writes succeed while they are recorded")

			retry := s.post(s.client(), "/payments", "gone", `{}`)
			require.Equal(t, http.StatusCreated, retry.status)
			require.Equal(t, "true", retry.header.Get(ReplayedHeader))
			require.Equal(t, len(big), len(retry.body), "the whole answer, not what reached the client")
			require.True(t, bytes.Equal(big, []byte(retry.body)))
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// A handler that writes until a write fails (and never would otherwise)
// learns of the failure once its answer is too large to keep, and its key
// is then not replayable: never a truncated answer presented as complete.
func TestClientGoneWriteUntilErrorIsNotReplayable(t *testing.T) {
	s := newShop(t, WithMaxResponseBytes(256<<10))
	finished := make(chan int)
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		chunk := bytes.Repeat([]byte("x"), 4096)
		written := 0
		for written < 64<<20 { // bounded, in case a write never fails
			n, err := w.Write(chunk)
			written += n
			if err != nil {
				break
			}
		}
		finished <- written
	}
	abandonFirstPost(t, s.srv.URL, "/payments", "until-error", `{}`)
	require.Less(t, <-finished, 64<<20, "the handler saw its write fail")
	a := s.post(s.client(), "/payments", "until-error", `{}`)
	requireProblem(t, a, http.StatusConflict, "not-replayable")
	require.EqualValues(t, 1, s.execs.Load())
}

// A write deadline that passes, or a timeout handler outside that gives up,
// fails the handler's writes; the retry still gets the whole answer.
func TestFailedWritesStillRecordTheWholeAnswer(t *testing.T) {
	big := bytes.Repeat([]byte("y"), 200<<10)
	t.Run("write deadline", func(t *testing.T) {
		s := newShop(t)
		s.handler = func(w http.ResponseWriter, r *http.Request) {
			http.NewResponseController(w).SetWriteDeadline(time.Now().Add(-time.Second))
			w.WriteHeader(http.StatusCreated)
			io.Copy(w, io.LimitReader(bytes.NewReader(big), int64(len(big)))) // 32 KiB writes
		}
		c := s.client()
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "deadline")
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		retry := s.post(c, "/payments", "deadline", `{}`)
		require.Equal(t, http.StatusCreated, retry.status)
		require.Equal(t, len(big), len(retry.body))
		require.EqualValues(t, 1, s.execs.Load())
	})
	t.Run("timeout handler outside", func(t *testing.T) {
		prefix := "test-" + strings.ReplaceAll(t.Name(), "/", "-")
		m := New(redistest.Client(t, prefix), WithKeyPrefix(prefix), WithCallerCredentials())
		var execs atomic.Int64
		h := http.TimeoutHandler(m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if execs.Add(1) == 1 {
				time.Sleep(150 * time.Millisecond) // past the timeout handler's bound
			}
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(big); i += 4096 {
				if _, err := w.Write(big[i:min(i+4096, len(big))]); err != nil {
					return
				}
			}
		})), 50*time.Millisecond, "timed out")
		srv := httptest.NewServer(h)
		defer srv.Close()
		post := func() (answer, error) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
			req.Header.Set(KeyHeader, "timeout")
			return tryDo(srv.Client(), req)
		}
		first, err := post()
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, first.status, "the timeout handler answered")
		require.Eventually(t, func() bool {
			a, err := post()
			return err == nil && a.status == http.StatusCreated && len(a.body) == len(big)
		}, 5*time.Second, 20*time.Millisecond)
		require.EqualValues(t, 1, execs.Load())
	})
}

// outerMiddleware decorates every response as request-id, CORS and an eager
// gzip middleware do, per request.
func outerMiddleware(next http.Handler) http.Handler {
	var ids atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", strconv.FormatInt(ids.Add(1), 10))
		if origin := r.Header.Get("Origin"); origin != "" {
			w.Header().Set("Access-Control-Allow-Origin", origin)
		}
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			next.ServeHTTP(w, r)
			return
		}
		gz := &gzipWriter{ResponseWriter: w, gz: gzip.NewWriter(w)}
		next.ServeHTTP(gz, r)
		gz.gz.Close()
	})
}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (g *gzipWriter) WriteHeader(code int) {
	g.Header().Set("Content-Encoding", "gzip")
	g.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(code)
}

func (g *gzipWriter) Write(p []byte) (int, error) { return g.gz.Write(p) }

// What middleware outside the protection sets is neither stored nor
// replayed: a replay is decorated by the replaying request's own outer
// middleware, and an outer compression is applied per request.
func TestOuterMiddlewareDecoratesEachAnswer(t *testing.T) {
	prefix := "test-" + t.Name()
	m := New(redistest.Client(t, prefix), WithKeyPrefix(prefix), WithCallerCredentials())
	body := strings.Repeat(`{"order":"tea"}`, 70) // 1 KiB, worth compressing
	var execs atomic.Int64
	h := m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}))
	srv := httptest.NewServer(outerMiddleware(h))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	post := func(origin string, gzipped bool) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "outer")
		req.Header.Set("Origin", origin)
		if gzipped {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var r io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			require.NoError(t, err)
			r = zr
		}
		got, err := io.ReadAll(r)
		require.NoError(t, err, "the body is whole: no Content-Length computed before the outer transform")
		return resp, string(got)
	}
	first, got := post("https://a.example", true)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, body, got)
	require.Equal(t, "1", first.Header.Get("X-Request-Id"))

	plain, got := post("https://b.example", false)
	require.Equal(t, "true", plain.Header.Get(ReplayedHeader))
	require.Equal(t, body, got)
	require.Empty(t, plain.Header.Get("Content-Encoding"), "not compressed for a client that did not ask")
	require.Equal(t, "2", plain.Header.Get("X-Request-Id"), "the replaying request's own id")
	require.Equal(t, "https://b.example", plain.Header.Get("Access-Control-Allow-Origin"))

	zipped, got := post("https://c.example", true)
	require.Equal(t, "true", zipped.Header.Get(ReplayedHeader))
	require.Equal(t, "gzip", zipped.Header.Get("Content-Encoding"))
	require.Equal(t, body, got)
	require.Equal(t, "3", zipped.Header.Get("X-Request-Id"))
	require.Equal(t, "https://c.example", zipped.Header.Get("Access-Control-Allow-Origin"))
	require.EqualValues(t, 1, execs.Load())
}

// A handler that sets headers and returns without writing answers an
// implicit 200 with those headers, and its replay carries them too.
func TestHeadersOfAHandlerThatNeverWrites(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/42")
		w.Header().Set("X-Order-Id", "42")
	}
	c := s.client()
	for i, a := range []answer{s.post(c, "/payments", "quiet", `{}`), s.post(c, "/payments", "quiet", `{}`)} {
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, "/orders/42", a.header.Get("Location"), "answer %d", i)
		require.Equal(t, "42", a.header.Get("X-Order-Id"), "answer %d", i)
	}
	require.EqualValues(t, 1, s.execs.Load())
}
