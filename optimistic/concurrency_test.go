package optimistic

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// writers is how many goroutines increment one counter, once each.
const writers = 20

// contention is generous with attempts: the point is that no increment is
// lost, not how often a writer gives up.
var contention = Policy{Attempts: 100}

// attempts counts the runs of read-modify-write functions and how many of
// them hit a conflict.
type attempts struct{ runs, conflicts atomic.Int64 }

func (a *attempts) log(t *testing.T) {
	t.Logf("%s: %d writers: %d attempts, %d conflicts (conflict rate %.0f%%)",
		t.Name(), writers, a.runs.Load(), a.conflicts.Load(), 100*float64(a.conflicts.Load())/float64(a.runs.Load()))
}

// race runs increment from every writer at once, each through Retry.
func race(t *testing.T, a *attempts, increment func(ctx context.Context) error) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			<-start
			errs <- Retry(t.Context(), contention, func(ctx context.Context) error {
				a.runs.Add(1)
				err := increment(ctx)
				if errors.Is(err, ErrConflict) {
					a.conflicts.Add(1)
				}
				return err
			})
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestConcurrentIncrementsSQL(t *testing.T) {
	eachDB(t, func(t *testing.T, d *testDB) {
		tbl := d.accounts(t, map[int64]int64{1: 0})
		read := d.rebind("SELECT balance, version FROM " + tbl.Name + " WHERE id = ?")
		var a attempts
		race(t, &a, func(ctx context.Context) error {
			var balance, version int64
			if err := d.db.QueryRowContext(ctx, read, 1).Scan(&balance, &version); err != nil {
				return err
			}
			_, err := tbl.Update(ctx, d.db, 1, version, Set("balance", balance+1))
			return err
		})
		got := d.row(t, tbl, 1)
		require.EqualValues(t, writers, got.balance, "no increment lost")
		require.EqualValues(t, writers, got.version)
		a.log(t)
	})
}

func TestConcurrentIncrementsRedis(t *testing.T) {
	prefix := "test-optimistic-" + t.Name()
	rdb := redistest.Client(t, prefix)
	key := prefix + ":counter"
	var h Hash
	var a attempts
	race(t, &a, func(ctx context.Context) error {
		fields, version, err := h.Read(ctx, rdb, key)
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(fields["n"]) // a missing hash reads as no fields: n starts at 0
		_, err = h.CompareAndSet(ctx, rdb, key, version, map[string]any{"n": n + 1})
		return err
	})
	fields, version, err := h.Read(t.Context(), rdb, key)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(writers), fields["n"], "no increment lost")
	require.EqualValues(t, writers, version)
	a.log(t)
}
