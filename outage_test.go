package idempotency

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// When Redis stops answering, the middleware's own log and its observer
// hear that protected routes refuse requests once when it begins (not once
// per request), and once when they answer again, with how many it refused
// in between; each refused request is still observed as a StoreError. A
// real redis-server stops answering in two ways: it dies and a supervisor
// starts it again (connections refused, then a new, empty server), or it
// stalls (the store timeout cuts every command short).
func TestRedisOutageReachesTheLogAndTheObserver(t *testing.T) {
	for _, tc := range []struct {
		name         string
		stop, resume func(t *testing.T, srv *redistest.Server)
	}{
		{"killed and restarted",
			func(t *testing.T, srv *redistest.Server) { srv.Stop() },
			func(t *testing.T, srv *redistest.Server) { redistest.Restart(t, srv) }},
		{"stalled and resumed",
			func(t *testing.T, srv *redistest.Server) { require.NoError(t, srv.Signal(syscall.SIGSTOP)) },
			func(t *testing.T, srv *redistest.Server) { require.NoError(t, srv.Signal(syscall.SIGCONT)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Private(t)
			opts := srv.Options()
			opts.MaxRetries = -1
			rdb := redis.NewClient(opts)
			t.Cleanup(func() { rdb.Close() })
			var log syncbuf.Buffer
			var events eventLog
			h := New(rdb, WithKeyPrefix("outage"), WithCallerCredentials(), WithStoreTimeout(200*time.Millisecond),
				WithLogger(slog.New(slog.NewTextHandler(&log, nil))), WithObserver(events.observe)).ProtectKey(newCounting(0))

			require.Equal(t, http.StatusCreated, send(h, "before", `{}`).Code)
			tc.stop(t, srv)
			for _, key := range []string{"a", "b", "c"} {
				require.Equal(t, http.StatusServiceUnavailable, send(h, key, `{}`).Code)
			}
			refusing := linesWith(log.String(), "refusing requests")
			require.Len(t, refusing, 1, log.String())
			assert.Contains(t, refusing[0], "refused=1")
			assert.Contains(t, refusing[0], "error=", "the line says why Redis did not answer")

			tc.resume(t, srv)
			// A connection the pool kept from before may fail once more.
			require.Eventually(t, func() bool { return send(h, "after", `{}`).Code == http.StatusCreated },
				10*time.Second, 50*time.Millisecond)

			events.mu.Lock()
			defer events.mu.Unlock()
			var reports []Event
			refused := 0
			for _, e := range events.events {
				if e.Outcome == StoreError {
					refused++
				}
				if e.Outage != nil {
					reports = append(reports, e)
				}
			}
			require.GreaterOrEqual(t, refused, 3)
			require.Len(t, reports, 2, "one report as it began, one as it ended")
			began, ended := reports[0], reports[1]
			assert.Equal(t, StoreError, began.Outcome, "the request that began it was refused")
			assert.ErrorIs(t, began.Err, ErrStoreUnavailable)
			assert.Equal(t, Outage{Phase: OutageBegan, Since: began.Outage.Since, Refused: 1}, *began.Outage)
			assert.WithinDuration(t, began.Start, began.Outage.Since, began.Duration)
			assert.Equal(t, Executed, ended.Outcome, "the request that ended it ran")
			assert.Equal(t, OutageEnded, ended.Outage.Phase)
			assert.Equal(t, int64(refused), ended.Outage.Refused)
			assert.Equal(t, began.Outage.Since, ended.Outage.Since)
			assert.Positive(t, ended.Outage.Duration)

			again := linesWith(log.String(), "answer again")
			require.Len(t, again, 1, log.String())
			assert.Contains(t, again[0], "refused="+itoa(int64(refused)))
			assert.Len(t, linesWith(log.String(), "refusing requests"), 1, "no new outage began")
		})
	}
}

// While an outage goes on, a line and a report every outageReportEvery say
// how many requests it refused so far; answers that Redis took no part in
// neither end it nor count.
func TestOutageReportsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	var o outageWatch
	t0 := time.Unix(1_700_000_000, 0)
	refusal := verdict{outcome: StoreError, err: unavailable(redis.ErrClosed)}
	var reports []*Outage
	note := func(v verdict, fromRedis bool, at time.Duration) {
		if news := o.note(logger, v, fromRedis, t0.Add(at)); news != nil {
			reports = append(reports, news)
		}
	}
	for i := range 10 {
		note(refusal, true, time.Duration(i)*time.Second)
	}
	note(verdict{outcome: Rejected, err: ErrMissingKey}, true, 9*time.Second)
	note(verdict{outcome: Replayed}, false, 9*time.Second) // from this process's memory
	require.Len(t, linesWith(buf.String(), "idempotency:"), 1, buf.String())
	require.Equal(t, []*Outage{{Phase: OutageBegan, Since: t0, Refused: 1}}, reports)

	note(refusal, true, outageReportEvery)
	still := linesWith(buf.String(), "still refusing")
	require.Len(t, still, 1, buf.String())
	assert.Contains(t, still[0], "refused=11")
	assert.Contains(t, still[0], "for=10s")
	require.Len(t, reports, 2)
	assert.Equal(t, Outage{Phase: OutageOngoing, Since: t0, Refused: 11, Duration: 10 * time.Second}, *reports[1])

	note(verdict{outcome: Executed}, true, 12*time.Second)
	again := linesWith(buf.String(), "answer again")
	require.Len(t, again, 1, buf.String())
	assert.Contains(t, again[0], "refused=11")
	assert.Contains(t, again[0], "for=12s")
	require.Len(t, reports, 3)
	assert.Equal(t, Outage{Phase: OutageEnded, Since: t0, Refused: 11, Duration: 12 * time.Second}, *reports[2])

	note(verdict{outcome: Executed}, true, 13*time.Second)
	assert.Len(t, linesWith(buf.String(), "idempotency:"), 3, "no outage, no line")
	assert.Len(t, reports, 3, "no outage, no report")
}

// LogObserver puts an outage's report on the line of the request that
// carries it, at info level at least: the request that ended it executed,
// which alone logs at debug.
func TestLogObserverReportsOutages(t *testing.T) {
	var buf bytes.Buffer
	obs := LogObserver(slog.New(slog.NewTextHandler(&buf, nil)))
	obs(Event{Outcome: Executed, Duration: time.Millisecond})
	obs(Event{Outcome: Executed, Duration: time.Millisecond,
		Outage: &Outage{Phase: OutageEnded, Since: time.Now(), Refused: 11, Duration: 12 * time.Second}})
	assert.Equal(t, 1, strings.Count(buf.String(), "\n"), buf.String())
	assert.Contains(t, buf.String(), "level=INFO msg=idempotency outcome=executed")
	assert.Contains(t, buf.String(), "outage.phase=ended outage.refused=11 outage.for=12s")
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
