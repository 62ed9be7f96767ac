package idempotency

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Tests for the edges where a deployment meets the response and the lease:
// outer middleware, writes to a client that left, header bytes, records that
// vanish, and who may see a stored answer.

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
		m := New(redistest.Client(t, prefix), WithKeyPrefix(prefix))
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

// Header values round-trip any byte: a replay from Redis sends what net/http
// sent the first time, grows no header, and a stored Set-Cookie never comes
// back.
func TestHeaderValuesRoundTripAnyByte(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0)) // every replay from Redis
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Search", "tea\nSet-Cookie: session=attacker")
		w.Header().Set("X-Split", "a\nb")
		w.Header().Set("X-Colon", "k: v")
		w.Header()["X-Bytes"] = []string{"\t\xff ü", ""}
		w.WriteHeader(http.StatusCreated)
	}
	c := s.client()
	first := s.post(c, "/payments", "hdr", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	for _, replay := range []answer{s.post(c, "/payments", "hdr", `{}`), other.post(c, "/payments", "hdr", `{}`)} {
		require.Equal(t, http.StatusCreated, replay.status)
		require.Equal(t, "true", replay.header.Get(ReplayedHeader))
		require.Empty(t, replay.header.Values("Set-Cookie"))
		for _, name := range []string{"X-Search", "X-Split", "X-Colon", "X-Bytes"} {
			require.Equal(t, first.header.Values(name), replay.header.Values(name), name)
		}
	}
	require.EqualValues(t, 1, s.execs.Load())
}

// A header the handler set under a name that is not canonical
// (w.Header()["ETag"]) is judged by its canonical name: kept under an
// allowlist that names it, and never replayed when it is a cookie.
func TestNonCanonicalHeaderNamesFollowThePolicy(t *testing.T) {
	for name, opts := range map[string][]Option{
		"default policy": nil,
		"allowlist":      {WithReplayHeaders("ETag", "X-Note")},
	} {
		t.Run(name, func(t *testing.T) {
			s := newShop(t, append(opts, WithResponseCache(0, 0))...)
			other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header()["ETag"] = []string{`"v1"`}
				w.Header()["x-note"] = []string{"kept"}
				w.Header()["set-cookie"] = []string{"session=s1"}
				w.WriteHeader(http.StatusCreated)
			}
			// No cookie jar: a retry carrying the cookie would be another
			// caller's request under key mode's default scope.
			c := &http.Client{Timeout: 30 * time.Second}
			first := s.post(c, "/payments", "names", `{}`)
			require.Equal(t, "session=s1", first.header.Get("Set-Cookie"), "the first answer keeps its cookie")
			for _, replay := range []answer{s.post(c, "/payments", "names", `{}`), other.post(c, "/payments", "names", `{}`)} {
				require.Equal(t, "true", replay.header.Get(ReplayedHeader))
				require.Equal(t, `"v1"`, replay.header.Get("ETag"))
				require.Equal(t, "kept", replay.header.Get("X-Note"))
				require.Empty(t, replay.header.Values("Set-Cookie"), "a cookie is never replayed, whatever its name's case")
			}
		})
	}
}

// A stored Set-Cookie (or hop-by-hop header) is filtered at replay too, even
// when the record was written by an instance configured to keep it.
func TestReplayFiltersHeadersOfTheRecord(t *testing.T) {
	s := newShop(t, WithReplayHeaders("Set-Cookie", "Location", "Content-Type"))
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "cookie", `{}`).status)
	require.NotEmpty(t, s.post(c, "/payments", "cookie", `{}`).header.Values("Set-Cookie"), "configured to replay it")
	replay := other.post(c, "/payments", "cookie", `{}`)
	require.Equal(t, "true", replay.header.Get(ReplayedHeader))
	require.Empty(t, replay.header.Values("Set-Cookie"), "the default policy drops it at replay")
	require.Equal(t, "/orders/1", replay.header.Get("Location"))
}

// A record that cannot be decoded is answered truthfully: it ran, its answer
// cannot be replayed. Never 503 "nothing ran, retry".
func TestUndecodableRecordIsNotStoreUnavailable(t *testing.T) {
	var logs syncbuf.Buffer
	s := newShop(t, WithResponseCache(0, 0), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "corrupt", `{}`).status)
	k := clientKeys(s.idem.cfg.prefix, paymentID("corrupt"))
	require.NoError(t, s.rdb.HSet(t.Context(), k.record, "h", "\x01\x05ab").Err())
	for range 2 {
		a := s.post(c, "/payments", "corrupt", `{}`)
		requireProblem(t, a, http.StatusConflict, "unreadable-record")
		require.Empty(t, a.header.Get("Retry-After"), "retrying cannot help")
	}
	require.Contains(t, logs.String(), "cannot be decoded")
	require.EqualValues(t, 1, s.execs.Load())
}

// Records of the line format that earlier versions stored still replay.
func TestRecordsOfTheLineFormatStillReplay(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "old", `{}`).status)
	k := clientKeys(s.idem.cfg.prefix, paymentID("old"))
	require.NoError(t, s.rdb.HSet(t.Context(), k.record, "h", "Location: /orders/7\nX-Old: yes\n").Err())
	a := s.post(c, "/payments", "old", `{}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "/orders/7", a.header.Get("Location"))
	require.Equal(t, "yes", a.header.Get("X-Old"))
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
	m := New(redistest.Client(t, prefix), WithKeyPrefix(prefix))
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

// A record that vanishes while its handler runs (eviction, a flush) is
// written again when the answer is stored, the lock is let go at once, and
// the retry replays: never a second execution.
func TestRecordVanishingMidRunNeverRunsTwice(t *testing.T) {
	var logs syncbuf.Buffer
	s := newShop(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithResponseCache(0, 0))
	k := clientKeys(s.idem.cfg.prefix, paymentID("vanish"))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		s.rdb.Del(context.Background(), k.record) // evicted
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.post(c, "/payments", "vanish", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Zero(t, s.rdb.Exists(t.Context(), k.lock).Val(), "the lock is released with the store")
	retry := s.post(c, "/payments", "vanish", `{}`)
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader))
	require.Equal(t, first.body, retry.body)
	requireProblem(t, s.post(c, "/payments", "vanish", `{"other":1}`), 422, "key-reused")
	require.EqualValues(t, 1, s.execs.Load())
	require.Contains(t, logs.String(), "vanished while its handler ran")
	require.Empty(t, keysWithoutTTL(t, s.rdb, s.idem.cfg.prefix))
}

// Even in a full Redis (maxmemory reached), a record that vanished is
// written back with the answer: the retry replays.
func TestRecordVanishingInAFullRedis(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	s := newShopOn(t, rdb, WithResponseCache(0, 0))
	k := clientKeys(s.idem.cfg.prefix, paymentID("full"))
	ctx := context.Background()
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		rdb.Del(ctx, k.record)               // evicted
		rdb.ConfigSet(ctx, "maxmemory", "1") // and Redis is full
		s.defaultHandler(w, r)
	}
	c := s.client()
	first := s.post(c, "/payments", "full", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	// A full Redis refuses new locks (503, nothing runs); once it has room,
	// the retry finds the answer.
	requireProblem(t, s.post(c, "/payments", "full", `{}`), http.StatusServiceUnavailable, "store-unavailable")
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	retry := s.post(c, "/payments", "full", `{}`)
	require.Equal(t, "true", retry.header.Get(ReplayedHeader), retry.body)
	require.Equal(t, first.body, retry.body)
	require.EqualValues(t, 1, s.execs.Load())
}

// Options under which the lease cannot hold are refused at New, with a
// message that names the option.
func TestNewRefusesLeasesThatCannotHold(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for name, opts := range map[string][]Option{
		"WithRecordTTL":          {WithRecordTTL(10 * time.Second)}, // below 3 s lease + 30 s execution
		"WithExpiryHeader":       {WithExpiryHeader("Expires In")},
		"WithUnprotectedMethods": {WithUnprotectedMethods("")},
		"WithReplicaAcks":        {WithLockLease(300 * time.Millisecond), WithReplicaAcks(1, 2*time.Second)},
	} {
		msg, _ := panicMessage(func() { New(rdb, opts...) }).(string)
		require.Contains(t, msg, name)
	}
	require.NotPanics(t, func() {
		New(rdb, WithRecordTTL(time.Minute), WithExecutionTimeout(10*time.Second),
			WithLockLease(time.Second), WithReplicaAcks(1, 500*time.Millisecond))
	})
}

func panicMessage(f func()) (msg any) {
	defer func() { msg = recover() }()
	f()
	return nil
}

// beforeCommand runs do before every command that match picks: a slow
// script, a lagging replica, a lock taken away.
type beforeCommand struct {
	match func(redis.Cmder) bool
	do    func(context.Context)
}

func (beforeCommand) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h beforeCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, h.match) {
			h.do(ctx)
		}
		return next(ctx, cmds)
	}
}
func (h beforeCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.do(ctx)
		}
		return next(ctx, cmd)
	}
}

// signalThenSleep tells entered, without blocking, and then stalls for d.
func signalThenSleep(entered chan<- struct{}, d time.Duration) func(context.Context) {
	return func(context.Context) {
		select {
		case entered <- struct{}{}:
		default:
		}
		time.Sleep(d)
	}
}

// duplicateDuringSlowStep sends a request to a whose Redis stalls it in one
// step (entered says when), and the same request to b once the stall has
// lasted past; it returns both answers.
func duplicateDuringSlowStep(t *testing.T, a, b *shop, entered <-chan struct{}, past time.Duration) (first, dup answer) {
	t.Helper()
	c := a.client()
	done := a.postAsync(c, "/payments", "slow-step", `{}`)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled step never came: its hook matches nothing")
	}
	time.Sleep(past)
	dup = b.post(c, "/payments", "slow-step", `{}`)
	return (<-done).must(t), dup
}

// A claim rides in one pipeline with the lock (ride.go), so no pause can
// fall between the two. What can be slow is their reply: one that comes
// back after the whole lease lets the key go to a duplicate on another
// instance, and then the slow request must not start its handler. It
// answers 503, and its retry gets the duplicate's answer: one execution.
func TestLockAndClaimReplySlowerThanTheLease(t *testing.T) {
	prefix := "test-" + t.Name()
	slow, claiming := slowClaimReplies(t, prefix, 700*time.Millisecond)
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(300 * time.Millisecond),
		WithStoreTimeout(2 * time.Second), WithRetryAbandoned()}
	a := newShopOn(t, slow, opts...)
	b := newShopOn(t, redistest.Client(t, prefix), opts...)
	warmScripts(t, prefix)
	// Past the lease, while the reply is on its way.
	first, dup := duplicateDuringSlowStep(t, a, b, claiming, 400*time.Millisecond)
	require.Equal(t, http.StatusCreated, dup.status)
	require.Equal(t, http.StatusServiceUnavailable, first.status, first.body)
	require.Zero(t, a.execs.Load(), "the slow request lost the key before its handler started")
	require.EqualValues(t, 1, b.execs.Load())
	retry := a.post(a.client(), "/payments", "slow-step", `{}`)
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, dup.body, retry.body)
}

// A reply that comes back late, but within the lease, leaves the lock ours
// for less than the rest of its lease: the first renewal is due at once,
// not a third of a lease later, so the lock never runs out under a
// handler that started on it, and a duplicate on another instance waits.
func TestLockRenewedAtOnceAfterALateReply(t *testing.T) {
	prefix := "test-" + t.Name()
	slow, claiming := slowClaimReplies(t, prefix, 420*time.Millisecond) // 0.7 of the lease
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(600 * time.Millisecond),
		WithStoreTimeout(2 * time.Second), WithRetryAbandoned()}
	a := newShopOn(t, slow, opts...)
	b := newShopOn(t, redistest.Client(t, prefix), opts...)
	warmScripts(t, prefix)
	a.handler = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(600 * time.Millisecond) // past where the lock ran out unrenewed
		a.defaultHandler(w, r)
	}
	first, dup := duplicateDuringSlowStep(t, a, b, claiming, 800*time.Millisecond)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, http.StatusCreated, dup.status, dup.body)
	require.Equal(t, first.body, dup.body)
	require.EqualValues(t, 1, a.execs.Load())
	require.Zero(t, b.execs.Load(), "the duplicate found the key held, not abandoned")
}

// slowClaimReplies is a client whose replies to the lock-and-claim
// pipeline come back d late; claiming says when the first such reply came.
func slowClaimReplies(t *testing.T, prefix string, d time.Duration) (*redis.Client, <-chan struct{}) {
	slow := redistest.Client(t, prefix).(*redis.Client)
	claiming := make(chan struct{}, 1)
	slow.AddHook(afterPipeline{
		match: func(cmd redis.Cmder) bool {
			args := cmd.Args()
			return len(args) > 1 && (args[1] == claimScript.Hash() || args[1] == claimSource)
		},
		do: signalThenSleep(claiming, d),
	})
	return slow, claiming
}

// warmScripts has the test's Redis load the scripts, through a shop of its
// own, so that a stalled step of the test stalls once, not again for a
// NOSCRIPT resend.
func warmScripts(t *testing.T, prefix string) {
	t.Helper()
	s := newShopOn(t, redistest.Client(t, prefix), WithKeyPrefix(prefix))
	require.Equal(t, http.StatusCreated, s.post(s.client(), "/payments", "warm-scripts", `{}`).status)
}

// afterPipeline runs do once a pipeline holding a matching command has had
// its replies: a reply that is slow to arrive.
type afterPipeline beforeCommand

func (afterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (afterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if slices.ContainsFunc(cmds, h.match) {
			h.do(ctx)
		}
		return err
	}
}

// A claim resent after it answered "abandoned" answers "abandoned" again.
func TestResentClaimAfterAbandoned(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	k := clientKeys(s.idem.cfg.prefix, paymentID("resend"))
	crashAfterClaim(t, s, k, "fp")
	time.Sleep(150 * time.Millisecond)
	ctx := t.Context()
	lock, err := s.idem.store.obtain(ctx, k)
	require.NoError(t, err)
	for range 2 {
		cl, err := s.idem.store.claim(ctx, k, lock.Token(), "fp")
		require.NoError(t, err)
		require.Equal(t, outcomeAbandoned, cl.outcome)
	}
	require.Zero(t, s.rdb.Exists(ctx, k.lock).Val(), "the lock was let go")
}

// formReader parses the form before the protection, as CSRF and method
// override middleware do.
func formReader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseMultipartForm(1 << 20)
		r.PostFormValue("csrf")
		next.ServeHTTP(w, r)
	})
}

// Behind middleware that parsed the form, token mode finds the token in
// the parsed form, fingerprints the form, and serves the request.
func TestTokenInAFormParsedByOuterMiddleware(t *testing.T) {
	s := newShop(t)
	var execs atomic.Int64
	h := formReader(s.idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "item="+r.PostFormValue("item")+" n="+strconv.FormatInt(execs.Load(), 10))
	})))
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := s.client()
	tok := s.token(c)
	session := sessionOf(t, s, c)
	send := func(contentType string, body io.Reader) answer {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		req.Header.Set("Content-Type", contentType)
		req.AddCookie(&http.Cookie{Name: "idempotency_session", Value: session})
		return do(t, srv.Client(), req)
	}
	form := func(item string) answer {
		return send("application/x-www-form-urlencoded",
			strings.NewReader(url.Values{"idempotency_token": {tok}, "item": {item}, "csrf": {"x"}}.Encode()))
	}
	first := form("tea")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, "item=tea n=1", first.body)
	require.Equal(t, first.body, form("tea").body)
	requireProblem(t, form("coffee"), 422, "key-reused")

	tok = s.token(c)
	multi := func(item string) answer {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		mw.WriteField("idempotency_token", tok)
		mw.WriteField("item", item)
		fw, _ := mw.CreateFormFile("receipt", "r.txt")
		fw.Write([]byte("paper"))
		mw.Close()
		return send(mw.FormDataContentType(), &buf)
	}
	first = multi("milk")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, "item=milk n=2", first.body)
	require.Equal(t, "true", multi("milk").header.Get(ReplayedHeader))
	requireProblem(t, multi("sugar"), 422, "key-reused")
	require.EqualValues(t, 2, execs.Load())
}

// The in-process cache answers for a bounded time, and then asks Redis:
// after Redis lost its data and another instance ran the key again, every
// instance agrees within that bound.
func TestCacheAgreesWithRedisAfterDataLoss(t *testing.T) {
	a := newShop(t, WithResponseCacheTTL(300*time.Millisecond))
	b := newShopOn(t, a.rdb, WithKeyPrefix(a.idem.cfg.prefix), WithResponseCache(0, 0))
	unique := func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strconv.FormatInt(time.Now().UnixNano(), 10))
	}
	a.handler, b.handler = unique, unique
	c := a.client()
	first := a.post(c, "/payments", "lost", `{}`)
	require.Equal(t, "true", a.post(c, "/payments", "lost", `{}`).header.Get(ReplayedHeader))

	redistest.DeletePrefix(t, a.rdb, a.idem.cfg.prefix) // Redis restarted without persistence
	again := b.post(c, "/payments", "lost", `{}`)
	require.Empty(t, again.header.Get(ReplayedHeader), "the other instance ran the key again")
	require.NotEqual(t, first.body, again.body)
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, a.srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "lost")
		got, err := tryDo(c, req)
		return err == nil && got.body == again.body
	}, 2*time.Second, 50*time.Millisecond, "the cached answer gives way to Redis's")
}

// Every path to a stored answer checks the fingerprint: the cache, a
// request waiting in this process, one waiting on another instance, and
// Redis.
func TestEveryReplayPathChecksTheFingerprint(t *testing.T) {
	t.Run("cache", func(t *testing.T) {
		s := newShop(t)
		c := s.client()
		require.Equal(t, http.StatusCreated, s.post(c, "/payments", "fp", `{"a":1}`).status)
		requireProblem(t, s.post(c, "/payments", "fp", `{"a":2}`), 422, "key-reused")
	})
	t.Run("redis", func(t *testing.T) {
		s := newShop(t, WithResponseCache(0, 0))
		c := s.client()
		require.Equal(t, http.StatusCreated, s.post(c, "/payments", "fp", `{"a":1}`).status)
		requireProblem(t, s.post(c, "/payments", "fp", `{"a":2}`), 422, "key-reused")
	})
	slowFirst := func(t *testing.T, s *shop, dup *shop) answer {
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		defer free() // also when an assertion fails, so the server can close
		s.handler = func(w http.ResponseWriter, r *http.Request) { <-release; s.defaultHandler(w, r) }
		c := s.client()
		done := s.postAsync(c, "/payments", "fp", `{"a":1}`)
		require.Eventually(t, func() bool { return s.execs.Load() == 1 }, 5*time.Second, time.Millisecond)
		began := time.Now()
		a := dup.post(c, "/payments", "fp", `{"a":2}`)
		require.Less(t, time.Since(began), time.Second, "refused at once, not after the wait")
		free()
		require.Equal(t, http.StatusCreated, (<-done).must(t).status)
		return a
	}
	t.Run("waiting in process", func(t *testing.T) {
		s := newShop(t)
		requireProblem(t, slowFirst(t, s, s), 422, "key-reused")
		require.EqualValues(t, 1, s.execs.Load())
	})
	t.Run("waiting on another instance", func(t *testing.T) {
		s := newShop(t)
		other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
		requireProblem(t, slowFirst(t, s, other), 422, "key-reused")
		require.EqualValues(t, 1, s.execs.Load()+other.execs.Load())
	})
}

// New warns when Redis may evict the middleware's keys.
func TestNewWarnsOfAnEvictingRedis(t *testing.T) {
	srv := redistest.Private(t, "--maxmemory-policy", "allkeys-lru")
	var logs syncbuf.Buffer
	New(srv.Client(t), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Contains(t, logs.String(), "maxmemory-policy=allkeys-lru")

	var quiet syncbuf.Buffer
	safe := redistest.Private(t, "--maxmemory-policy", "noeviction")
	New(safe.Client(t), WithLogger(slog.New(slog.NewTextHandler(&quiet, nil))))
	require.NotContains(t, quiet.String(), "maxmemory-policy")
}

// A watchdog that cannot reach Redis reports the lease lost before the lock
// expires, so that the handler knows before another instance may take the
// key; and not much before.
func TestWatchdogReportsLossBeforeTheLockExpires(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	began := time.Now()
	lock, err := redislock.New(rdb).Obtain(t.Context(), "watchdog-test", 1500*time.Millisecond, nil)
	require.NoError(t, err)
	wd := startWatchdog(lock, 1500*time.Millisecond, time.Second, began)
	defer wd.stop()
	lost := make(chan time.Duration, 1)
	wd.notify(func() { lost <- time.Since(began) })
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	defer srv.Signal(syscall.SIGCONT)
	select {
	case at := <-lost:
		require.Less(t, at, 1500*time.Millisecond, "before the lock expired")
		require.Greater(t, at, time.Second, "after the renewals could still land")
	case <-time.After(3 * time.Second):
		t.Fatal("the lost lease was never reported")
	}
}

// A Redis that lost its scripts (a restart, a failover to a replica that
// never loaded them, SCRIPT FLUSH) answers NOSCRIPT to the lock, and to the
// claim that rides with it or runs it without the lock. Both are sent again
// as scripts: the first request runs once and its duplicate on another
// instance is replayed.
func TestScriptsFlushedBetweenRequests(t *testing.T) {
	prefix := "test-" + t.Name()
	rdb := redistest.Client(t, prefix)
	a := newShopOn(t, rdb, WithKeyPrefix(prefix))
	b := newShopOn(t, redistest.Client(t, prefix), WithKeyPrefix(prefix))
	require.Equal(t, http.StatusCreated, a.post(a.client(), "/payments", "warm", `{}`).status)
	for _, claimLoaded := range []bool{false, true} {
		key := fmt.Sprint("after-flush-", claimLoaded)
		require.NoError(t, rdb.ScriptFlush(t.Context()).Err())
		if claimLoaded { // the lock's script is missing, the claim's is not
			require.NoError(t, claimScript.Load(t.Context(), rdb).Err())
		}
		first := a.post(a.client(), "/payments", key, `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.NoError(t, rdb.ScriptFlush(t.Context()).Err())
		dup := b.post(b.client(), "/payments", key, `{}`)
		require.Equal(t, http.StatusCreated, dup.status, dup.body)
		require.Equal(t, "true", dup.header.Get(ReplayedHeader))
		require.Equal(t, first.body, dup.body)
	}
	require.EqualValues(t, 3, a.execs.Load())
	require.Zero(t, b.execs.Load())
}
