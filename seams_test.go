package idempotency

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// stack serves handler protected in key mode behind outer, counting its
// executions; tls serves HTTP/2 over TLS as well.
type stack struct {
	t     *testing.T
	idem  *Middleware
	srv   *httptest.Server
	execs atomic.Int64
}

func newStack(t *testing.T, outer func(http.Handler) http.Handler, handler http.HandlerFunc, h2 bool, opts ...Option) *stack {
	t.Helper()
	prefix := "test-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	s := &stack{t: t, idem: New(redistest.Client(t, prefix), append([]Option{WithKeyPrefix(prefix), WithCallerCredentials()}, opts...)...)}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.execs.Add(1)
		handler(w, r)
	})
	var h http.Handler = s.idem.ProtectKey(counted)
	if outer != nil {
		h = outer(h)
	}
	s.srv = httptest.NewUnstartedServer(h)
	if h2 {
		s.srv.EnableHTTP2 = true
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	t.Cleanup(s.srv.Close)
	return s
}

// post sends a key-mode POST with the extra headers given as name, value.
func (s *stack) post(key string, header ...string) answer {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/pay", strings.NewReader(`{}`))
	require.NoError(s.t, err)
	req.Header.Set(KeyHeader, key)
	for i := 0; i < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	c := s.srv.Client()
	if tr, ok := c.Transport.(*http.Transport); ok {
		tr.DisableCompression = true
	}
	resp, err := c.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	resp.Header.Del("Date")
	return answer{status: resp.StatusCode, header: mergeTrailer(resp), body: string(body)}
}

// mergeTrailer adds the response's trailers to its header as
// "Trailer:Name", so that one comparison covers both.
func mergeTrailer(resp *http.Response) http.Header {
	for name, values := range resp.Trailer {
		if len(values) > 0 {
			resp.Header[http.TrailerPrefix+name] = values
		}
	}
	return resp.Header
}

// A handler's header joins what the layers outside the protection set,
// on the first answer as without the middleware, and on a replay with what
// the replaying request's layers set.
func TestOuterHeadersAreKept(t *testing.T) {
	session := func(next http.Handler) http.Handler {
		var n atomic.Int64
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "refreshed-" + strconv.FormatInt(n.Add(1), 10)})
			w.Header().Add("Vary", "Origin")
			next.ServeHTTP(w, r)
		})
	}
	s := newStack(t, session, func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "flash", Value: "paid"})
		w.Header().Add("Vary", "Accept-Language")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"paid":true}`)
	}, false)
	first := s.post("cookie", "Accept-Language", "en")
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, []string{"session=refreshed-1", "flash=paid"}, first.header["Set-Cookie"])
	require.Equal(t, []string{"Origin", "Accept-Language"}, first.header["Vary"])

	replay := s.post("cookie", "Accept-Language", "en")
	require.Equal(t, "true", replay.header.Get(ReplayedHeader))
	require.Equal(t, []string{"session=refreshed-2"}, replay.header["Set-Cookie"], "the handler's cookie is not replayed, the session's own is kept")
	require.Equal(t, []string{"Origin", "Accept-Language"}, replay.header["Vary"])
	require.Equal(t, first.body, replay.body)
	require.EqualValues(t, 1, s.execs.Load())

	// The answer varies on Accept-Language: another language's request
	// does not get the English one.
	requireProblem(t, s.post("cookie", "Accept-Language", "fr"), http.StatusNotAcceptable, "not-acceptable")
}

// Trailers are stored and replayed, over HTTP/1.1 and HTTP/2.
func TestTrailersAreReplayed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run("h2="+strconv.FormatBool(h2), func(t *testing.T) {
			s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "Content-Digest")
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "hello")
				w.Header().Set("Content-Digest", "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:")
				w.Header().Set(http.TrailerPrefix+"X-Rows", "1")
			}, h2)
			first := s.post("t")
			require.Equal(t, "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:", first.header.Get(http.TrailerPrefix+"Content-Digest"))
			require.Equal(t, "1", first.header.Get(http.TrailerPrefix+"X-Rows"))
			replay := s.post("t")
			require.Equal(t, "true", replay.header.Get(ReplayedHeader))
			replay.header.Del(ReplayedHeader)
			require.Equal(t, first, replay)
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// A route protected twice by one Middleware (a group's layer and its own)
// runs once, and its duplicate replays the handler's answer.
func TestNestedProtectionStepsAside(t *testing.T) {
	var inner func(http.Handler) http.Handler
	s := newStack(t, nil, nil, false)
	inner = s.idem.ProtectKey
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.execs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	})
	s.srv.Config.Handler = s.idem.ProtectKey(inner(handler))
	start := time.Now()
	first := s.post("twice")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Less(t, time.Since(start), 2*time.Second, "no wait for the outer layer's own claim")
	replay := s.post("twice")
	require.Equal(t, http.StatusCreated, replay.status)
	require.Equal(t, "true", replay.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())

	// Another Middleware on the same record steps aside too.
	other := New(s.idem.redis.client, WithKeyPrefix(s.idem.cfg.prefix), WithCallerCredentials())
	s.srv.Config.Handler = s.idem.ProtectKey(other.ProtectKey(handler))
	require.Equal(t, http.StatusCreated, s.post("other").status)
	require.EqualValues(t, 2, s.execs.Load())
}

// Under a writer that cannot flush (http.TimeoutHandler), a handler that
// flushes "if it can" streams nothing, and its answer is replayed.
func TestFlushThatCannotFlushIsNotStreaming(t *testing.T) {
	timeout := func(next http.Handler) http.Handler { return http.TimeoutHandler(next, 5*time.Second, "slow") }
	s := newStack(t, timeout, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part one ")
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		io.WriteString(w, "part two")
	}, false)
	require.Equal(t, "part one part two", s.post("f").body)
	replay := s.post("f")
	require.Equal(t, http.StatusOK, replay.status, replay.body)
	require.Equal(t, "part one part two", replay.body)
	require.EqualValues(t, 1, s.execs.Load())
}

// A stored answer in a coding the replaying request does not accept is
// sent decoded (gzip, deflate) or refused, never in that coding.
func TestReplayHonoursStoredContentEncoding(t *testing.T) {
	body := strings.Repeat(`{"order":"tea"}`, 70)
	zipped := gzipped([]byte(body))
	for _, coding := range []string{"gzip", "br"} {
		t.Run(coding, func(t *testing.T) {
			s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
				// An upstream that compresses by the request's negotiation.
				w.Header().Set("Vary", "Accept-Encoding")
				w.Header().Set("Content-Type", "application/json")
				if strings.Contains(r.Header.Get("Accept-Encoding"), coding) {
					w.Header().Set("Content-Encoding", coding)
					w.Write(zipped) // the bytes matter not for br: it is refused
					return
				}
				io.WriteString(w, body)
			}, false)
			first := s.post("z", "Accept-Encoding", coding)
			require.Equal(t, coding, first.header.Get("Content-Encoding"))
			again := s.post("z", "Accept-Encoding", coding+", identity")
			require.Equal(t, coding, again.header.Get("Content-Encoding"), "served as stored where acceptable")
			plain := s.post("z")
			if coding == "br" {
				requireProblem(t, plain, http.StatusNotAcceptable, "not-acceptable")
			} else {
				require.Equal(t, http.StatusOK, plain.status)
				require.Empty(t, plain.header.Get("Content-Encoding"))
				require.Equal(t, body, plain.body)
				require.Equal(t, "true", plain.header.Get(ReplayedHeader))
			}
			refused := s.post("z", "Accept-Encoding", coding+";q=0")
			require.Empty(t, refused.header.Get("Content-Encoding"))
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// Every stored coding the replay can undo is undone for a request that
// does not accept it, and any other is refused, never sent under a
// Content-Encoding it does not have: an answer with no body (a 204, or a
// 201 that a compressing layer marked), deflate with and without zlib's
// wrapper, and codings applied twice (two Content-Encoding lines).
func TestReplayDecodesEveryStoredCoding(t *testing.T) {
	body := strings.Repeat(`{"order":"tea"}`, 70)
	compress := func(w io.WriteCloser) {
		io.WriteString(w, body)
		w.Close()
	}
	var zl, raw bytes.Buffer
	twice := gzipped(gzipped([]byte(body)))
	compress(zlib.NewWriter(&zl))
	fw, _ := flate.NewWriter(&raw, flate.DefaultCompression)
	compress(fw)
	for _, tc := range []struct {
		name     string
		status   int
		codings  []string
		stored   []byte
		plain    string // what a request without Accept-Encoding gets; "" with status 406: refused
		refusedQ bool
	}{
		{"no content, gzip", http.StatusNoContent, []string{"gzip"}, nil, "", false},
		{"created without a body, gzip", http.StatusCreated, []string{"gzip"}, nil, "", false},
		{"deflate in zlib", http.StatusOK, []string{"deflate"}, zl.Bytes(), body, false},
		{"raw deflate", http.StatusOK, []string{"deflate"}, raw.Bytes(), body, false},
		{"gzip twice, two lines", http.StatusOK, []string{"gzip", "gzip"}, twice, "", true},
		{"gzip twice, one line", http.StatusOK, []string{"gzip, gzip"}, twice, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
				for _, c := range tc.codings {
					w.Header().Add("Content-Encoding", c)
				}
				w.WriteHeader(tc.status)
				w.Write(tc.stored)
			}, false)
			first := s.post("c", "Accept-Encoding", "gzip, deflate")
			require.Equal(t, tc.status, first.status, first.body)
			plain := s.post("c")
			if tc.refusedQ {
				requireProblem(t, plain, http.StatusNotAcceptable, "not-acceptable")
			} else {
				require.Equal(t, tc.status, plain.status, plain.body)
				require.Empty(t, plain.header.Values("Content-Encoding"))
				require.Equal(t, tc.plain, plain.body)
				require.Equal(t, "true", plain.header.Get(ReplayedHeader))
			}
			again := s.post("c", "Accept-Encoding", "gzip, deflate")
			require.Equal(t, tc.status, again.status)
			require.Equal(t, tc.codings, again.header.Values("Content-Encoding"), "served as stored where acceptable")
			require.Equal(t, string(tc.stored), again.body)
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}

// A body sent decoded is sent without what described its coded bytes: a
// digest of them is left out, and a strong entity tag is weakened (the
// same resource, not the same bytes); a response limit too large to
// multiply (math.MaxInt, "no limit") still decodes; and an allowlist of
// replayed headers that does not name Content-Encoding still keeps it
// with the body it describes.
func TestADecodedReplayDropsWhatDescribedItsBytes(t *testing.T) {
	body := strings.Repeat(`{"order":"tea"}`, 70)
	zipped := gzipped([]byte(body))
	s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Etag", `"v1-gzip"`)
		w.Header().Set("Content-Digest", "sha-256=:AAAA:")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(zipped)
	}, false, WithMaxResponseBytes(math.MaxInt), WithReplayHeaders("Etag", "Content-Digest", "Cache-Control"))
	first := s.post("tag", "Accept-Encoding", "gzip")
	require.Equal(t, `"v1-gzip"`, first.header.Get("Etag"))
	plain := s.post("tag")
	require.Equal(t, http.StatusOK, plain.status, plain.body)
	require.Equal(t, body, plain.body)
	require.Equal(t, `W/"v1-gzip"`, plain.header.Get("Etag"))
	require.Empty(t, plain.header.Values("Content-Digest"))
	require.Equal(t, "no-cache", plain.header.Get("Cache-Control"))
	again := s.post("tag", "Accept-Encoding", "gzip")
	require.Equal(t, `"v1-gzip"`, again.header.Get("Etag"))
	require.Equal(t, "sha-256=:AAAA:", again.header.Get("Content-Digest"))
	require.EqualValues(t, 1, s.execs.Load())
}

// A body decoded for a replay streams to the client: a replay does not
// hold the decoded body, which for a compression-friendly answer is many
// times the stored one, and concurrent replays would hold it each.
func TestADecodedReplayStreams(t *testing.T) {
	const decodedSize = 24 << 20 // within decodeLimit × the default 1 MiB
	zipped := gzipped(make([]byte, decodedSize))
	m := New(redistest.Client(t, "test-"+t.Name()), WithKeyPrefix("test-"+t.Name()), WithSharedKeys())
	h := m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(zipped)
	}))
	serve := func(acceptGzip bool) (*counted, int) {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r.Header.Set(KeyHeader, "big")
		if acceptGzip {
			r.Header.Set("Accept-Encoding", "gzip")
		}
		w := &counted{h: http.Header{}}
		h.ServeHTTP(w, r)
		return w, w.status
	}
	_, status := serve(true)
	require.Equal(t, http.StatusOK, status)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w, status := serve(false)
	runtime.ReadMemStats(&after)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, decodedSize, w.n, "the whole body, decoded")
	require.Empty(t, w.h.Get("Content-Encoding"))
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(decodedSize/4), "allocated for one decoded replay")
}

// gzipped is b in gzip.
func gzipped(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// counted is a ResponseWriter that counts the body's bytes and keeps none.
type counted struct {
	h      http.Header
	status int
	n      int64
}

func (w *counted) Header() http.Header         { return w.h }
func (w *counted) WriteHeader(code int)        { w.status = code }
func (w *counted) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// A small gzip body that decodes to far more than the response limit (a
// compression bomb a handler passed through; past decodeLimit times it) is
// never decoded for a replay: a request that does not accept gzip gets 406, one that does gets
// the stored bytes.
func TestAReplayNeverDecodesPastTheLimit(t *testing.T) {
	zipped := gzipped(make([]byte, 4<<20)) // more than decodeLimit × 64 KiB
	s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Vary", "Accept-Encoding")
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(zipped)
	}, false, WithMaxResponseBytes(64<<10))
	first := s.post("bomb", "Accept-Encoding", "gzip")
	require.Equal(t, http.StatusOK, first.status)
	requireProblem(t, s.post("bomb"), http.StatusNotAcceptable, "not-acceptable")
	again := s.post("bomb", "Accept-Encoding", "gzip")
	require.Equal(t, "gzip", again.header.Get("Content-Encoding"))
	require.Equal(t, len(zipped), len(again.body))
	require.EqualValues(t, 1, s.execs.Load())
}

// A handler that writes past its own Content-Length is replayed with what
// was sent, over HTTP/1.1 and HTTP/2 alike.
func TestContentLengthOverrunIsTheSameOnEveryProtocol(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run("h2="+strconv.FormatBool(h2), func(t *testing.T) {
			var writeErr atomic.Value
			s := newStack(t, nil, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "5")
				io.WriteString(w, "hello")
				if _, err := io.WriteString(w, " world"); err != nil {
					writeErr.Store(err)
				}
			}, h2)
			first := s.post("cl")
			require.Equal(t, "hello", first.body)
			require.NotNil(t, writeErr.Load(), "the handler learns of its bug")
			replay := s.post("cl")
			require.Equal(t, http.StatusOK, replay.status, replay.body)
			require.Equal(t, "hello", replay.body)
			require.EqualValues(t, 1, s.execs.Load())
		})
	}
}
