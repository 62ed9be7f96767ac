package idempotency

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// When Redis stops answering, the middleware's own log says that protected
// routes refuse requests, once when it begins (not once per request), and
// once when they answer again, with how many it refused in between.
func TestRedisOutageIsLoggedWhenItBeginsAndEnds(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var log syncbuf.Buffer
	h := New(rdb, WithKeyPrefix("outage"), WithCallerCredentials(), WithStoreTimeout(200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&log, nil)))).ProtectKey(newCounting(0))

	require.Equal(t, http.StatusCreated, send(h, "before", `{}`).Code)
	proxy.StartBlackhole()
	for _, key := range []string{"a", "b", "c"} {
		require.Equal(t, http.StatusServiceUnavailable, send(h, key, `{}`).Code)
	}
	refusing := linesWith(log.String(), "refusing requests")
	require.Len(t, refusing, 1, log.String())
	assert.Contains(t, refusing[0], "refused=1")

	proxy.EndBlackhole()
	require.Eventually(t, func() bool { return send(h, "after", `{}`).Code == http.StatusCreated },
		5*time.Second, 50*time.Millisecond)
	again := linesWith(log.String(), "answer again")
	require.Len(t, again, 1, log.String())
	assert.Contains(t, again[0], "refused=3")
	assert.Len(t, linesWith(log.String(), "refusing requests"), 1, "no new outage began")
}

// While an outage goes on, a line every outageReportEvery says how many
// requests it refused so far; answers that Redis took no part in neither
// end it nor count.
func TestOutageReportsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	var o outage
	t0 := time.Unix(1_700_000_000, 0)
	refusal := verdict{outcome: StoreError, err: unavailable(redis.ErrClosed)}
	for i := range 10 {
		o.note(logger, refusal, true, t0.Add(time.Duration(i)*time.Second))
	}
	o.note(logger, verdict{outcome: Rejected, err: ErrMissingKey}, true, t0.Add(9*time.Second))
	o.note(logger, verdict{outcome: Replayed}, false, t0.Add(9*time.Second)) // from this process's memory
	require.Len(t, linesWith(buf.String(), "idempotency:"), 1, buf.String())

	o.note(logger, refusal, true, t0.Add(outageReportEvery))
	still := linesWith(buf.String(), "still refusing")
	require.Len(t, still, 1, buf.String())
	assert.Contains(t, still[0], "refused=11")
	assert.Contains(t, still[0], "for=10s")

	o.note(logger, verdict{outcome: Executed}, true, t0.Add(12*time.Second))
	again := linesWith(buf.String(), "answer again")
	require.Len(t, again, 1, buf.String())
	assert.Contains(t, again[0], "refused=11")
	assert.Contains(t, again[0], "for=12s")

	o.note(logger, verdict{outcome: Executed}, true, t0.Add(13*time.Second))
	assert.Len(t, linesWith(buf.String(), "idempotency:"), 3, "no outage, no line")
}

func linesWith(log, s string) []string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
