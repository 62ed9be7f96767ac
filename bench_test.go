package idempotency

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// benchWriter is a ResponseWriter that keeps nothing, so that benchmarks
// count the middleware's allocations and not a recorder's.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) reset()                      { clear(w.h); w.status = 0 }

// rewindBody is a request body the benchmark loop can rewind without
// allocating.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

var benchResponse = []byte(`{"id":1,"item":"tea","quantity":1,"status":"placed"}`)

func benchHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.WriteHeader(http.StatusCreated)
	w.Write(benchResponse)
}

type benchRig struct {
	req  *http.Request
	body *rewindBody
	raw  []byte
	w    *benchWriter
}

func newBenchRig(key string) *benchRig {
	raw := []byte(`{"item":"tea","quantity":1}`)
	rig := &benchRig{raw: raw, body: &rewindBody{}, w: &benchWriter{h: http.Header{}}}
	rig.req = httptest.NewRequest(http.MethodPost, "/orders", nil)
	rig.req.Header.Set(KeyHeader, key)
	rig.req.Header.Set("Content-Type", "application/json")
	return rig
}

// serve runs h once on the rig's request.
func (rig *benchRig) serve(b *testing.B, h http.Handler, want int) {
	rig.body.Reset(rig.raw)
	rig.req.Body = rig.body
	rig.req.ContentLength = int64(len(rig.raw))
	rig.w.reset()
	h.ServeHTTP(rig.w, rig.req)
	if rig.w.status != want {
		b.Fatalf("status %d, want %d", rig.w.status, want)
	}
}

func benchRedis(b *testing.B) redis.UniversalClient {
	return redistest.Client(b, "bench-"+b.Name())
}

func BenchmarkBareHandler(b *testing.B) {
	rig := newBenchRig("k")
	h := http.HandlerFunc(benchHandler)
	b.ReportAllocs()
	for b.Loop() {
		rig.serve(b, h, http.StatusCreated)
	}
}

func BenchmarkFirstExecution(b *testing.B) {
	m := New(benchRedis(b), WithKeyPrefix("bench-"+b.Name()), WithCallerCredentials())
	h := m.ProtectKey(http.HandlerFunc(benchHandler))
	rig := newBenchRig("")
	b.ReportAllocs()
	rig.firstExecutions(b, h)
}

// firstExecutions runs h for b's loop, a new key each time.
func (rig *benchRig) firstExecutions(b *testing.B, h http.Handler) {
	keys := make([]string, 0, 1<<16)
	i := 0
	for b.Loop() {
		if i == len(keys) {
			b.StopTimer()
			for range 1 << 10 {
				keys = append(keys, "first-"+strconv.Itoa(len(keys)))
			}
			b.StartTimer()
		}
		rig.req.Header[KeyHeader][0] = keys[i]
		i++
		rig.serve(b, h, http.StatusCreated)
	}
}

func BenchmarkReplayFromRedis(b *testing.B) {
	rdb := benchRedis(b)
	prefix := WithKeyPrefix("bench-" + b.Name())
	first := New(rdb, prefix, WithCallerCredentials()).ProtectKey(http.HandlerFunc(benchHandler))
	// Another instance: nothing of the first's in its memory.
	h := New(rdb, prefix, WithCallerCredentials(), WithResponseCache(0, 0)).ProtectKey(http.HandlerFunc(benchHandler))
	rig := newBenchRig("replay")
	rig.serve(b, first, http.StatusCreated)
	b.ReportAllocs()
	for b.Loop() {
		rig.serve(b, h, http.StatusCreated)
	}
}

func BenchmarkReplayFromCache(b *testing.B) {
	h := New(benchRedis(b), WithKeyPrefix("bench-"+b.Name()), WithCallerCredentials()).ProtectKey(http.HandlerFunc(benchHandler))
	rig := newBenchRig("cached")
	rig.serve(b, h, http.StatusCreated)
	b.ReportAllocs()
	for b.Loop() {
		rig.serve(b, h, http.StatusCreated)
	}
}

func BenchmarkTokenIssuance(b *testing.B) {
	m := New(benchRedis(b), WithKeyPrefix("bench-"+b.Name()))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.IssueTokenFor(r, "bench-scope"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		body := bytes.Repeat([]byte("x"), size)
		r := httptest.NewRequest(http.MethodPost, "/orders?x=1", nil)
		b.Run(strconv.Itoa(size/1024)+"KiB", func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				(&config{}).fingerprint(r, body, true)
			}
		})
	}
	// A caller's material: a bearer token and two cookies, which are parsed.
	body := bytes.Repeat([]byte("x"), 1<<10)
	r := httptest.NewRequest(http.MethodPost, "/orders?x=1", nil)
	r.Header.Set("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjbGllbnQtNDIifQ.c2lnbmF0dXJl")
	r.Header.Set("Cookie", "session=MTcwMDAwMDAwMHxEdi1CQkFFQ180SUFBUkFCRUFBQV80; theme=dark")
	b.Run("1KiB-caller", func(b *testing.B) {
		b.SetBytes(1 << 10)
		b.ReportAllocs()
		for b.Loop() {
			(&config{}).fingerprint(r, body, true)
		}
	})
}

// BenchmarkRedisRoundTrip is one loopback round trip (PING), the unit in
// which the middleware's overhead is budgeted: a first execution should cost
// about three of these, a replay from Redis two.
func BenchmarkRedisRoundTrip(b *testing.B) {
	rdb := benchRedis(b)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}
