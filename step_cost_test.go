package idempotency

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// What a step costs Redis does not grow with the journal before it: a run
// whose journal is near WithMaxResponseBytes (a large step result, then a
// loop of small steps) must not hold Redis, which runs one script at a
// time, for a copy of the whole record at every step. Measured as Redis's
// own time in scripts (INFO commandstats) on a server of the test's own,
// so neither other tests nor the machine's load count.
func TestAStepCostsTheSameWithALongJournal(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	m := New(rdb, WithKeyPrefix("p"), WithMaxResponseBytes(1<<20))
	const steps = 200
	smallSteps := func(ctx context.Context, scripts func() time.Duration) time.Duration {
		before := scripts()
		for i := range steps {
			_, err := Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil })
			require.NoError(t, err)
		}
		return scripts() - before
	}
	scripts := func() time.Duration { return scriptTime(t, rdb) }
	var short, long time.Duration
	_, err := Do(context.Background(), m, Key{ID: "short"}, func(ctx context.Context) (int, error) {
		short = smallSteps(ctx, scripts)
		return 0, nil
	}, Resumable())
	require.NoError(t, err)
	_, err = Do(context.Background(), m, Key{ID: "long"}, func(ctx context.Context) (int, error) {
		_, err := Step(ctx, "big", func(context.Context) (string, error) { return strings.Repeat("x", 900<<10), nil })
		require.NoError(t, err)
		long = smallSteps(ctx, scripts)
		return 0, nil
	}, Resumable())
	require.NoError(t, err)
	t.Logf("%d steps: %v of scripts after an empty journal, %v after a 900 KiB one", steps, short, long)
	require.Less(t, long, 3*short+50*time.Millisecond, "a step's cost grows with the journal before it")
}

// scriptTime is Redis's time in scripts so far (EVAL and EVALSHA).
func scriptTime(t *testing.T, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	var usec float64
	for _, line := range strings.Split(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "usec" {
				n, _ := strconv.ParseFloat(v, 64)
				usec += n
			}
		}
	}
	return time.Duration(usec * float64(time.Microsecond))
}

// A step costs one Redis command, its journal write, which also proves the
// run still owns its key for the next step while the lock's time lasts; a
// step that comes later than that (after a pause, or a slow stretch of the
// handler) pays one command more, to prove it afresh. The claim proves it
// for the first step. Counted with MONITOR on a server of the test's own:
// the step script's commands, apart from the watchdog's renewals.
func TestAStepCostsOneCommandWhileItsRunIsProven(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	mon := redistest.StartMonitor(t, srv.Addr())
	const lease = time.Second
	m := New(rdb, WithKeyPrefix("p"), WithLockLease(lease), WithStoreTimeout(100*time.Millisecond))
	ctx := context.Background()
	step := func(ctx context.Context, name string) int {
		lines, err := mon.Lines(ctx, rdb, func() error {
			_, err := Step(ctx, name, func(context.Context) (int, error) { return 1, nil })
			return err
		})
		require.NoError(t, err)
		n := 0
		for _, l := range lines {
			if !strings.Contains(l, " lua]") && strings.Contains(l, stepScript.Hash()) {
				n++
			}
		}
		return n
	}
	var costs []int
	_, err := Do(ctx, m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
		costs = append(costs, step(ctx, "a"), step(ctx, "b"))
		time.Sleep(lease) // past the time the last journal write proved
		costs = append(costs, step(ctx, "c"), step(ctx, "d"))
		return 0, nil
	}, Resumable())
	require.NoError(t, err)
	require.Equal(t, []int{1, 1, 2, 1}, costs, "Redis commands per step")
}
