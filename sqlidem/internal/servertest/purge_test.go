package servertest_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// Purge deletes every row written before the cutoff, more than one batch
// of them, and none after.
func TestPurgeDeletesTheOldRows(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "outcomes")
		s, err := newStore(d, table)
		must(t, err)
		must(t, s.CreateTable(t.Context()))
		now := time.Now()
		oldRows(t, d, table, "old:", 2500, now.Add(-2*time.Hour).UnixMilli())
		oldRows(t, d, table, "new:", 7, now.UnixMilli())
		n, err := s.Purge(t.Context(), now.Add(-time.Hour))
		if err != nil || n != 2500 {
			t.Fatalf("Purge: %d, %v; want the 2500 old rows", n, err)
		}
		var left int
		must(t, d.QueryRow("SELECT COUNT(*) FROM "+table).Scan(&left))
		if left != 7 {
			t.Fatalf("%d rows left; want the 7 new ones", left)
		}
	})
}

// A purge that waits for a lock (here an old row that a transaction
// holds) stalls no commit of a new key. On MySQL a DELETE without an index
// on the write time scanned the whole table with next-key locks and held
// every gap it passed until it ended, so a new key's INSERT waited for the
// purge; in batches through the index it holds a thousand old rows at most.
func TestPurgeLetsNewKeysCommit(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		if d.Kind == sqltest.SQLite {
			t.Skip("SQLite has one writer at a time: every statement of a purge holds the whole database " +
				"while it runs, and the batches are what keep that short (measured by TestPurgeMeasure)")
		}
		b := newBank(t, d, idempotency.WithExecutionTimeout(5*time.Second))
		ctx := t.Context()
		old := time.Now().Add(-48 * time.Hour).UnixMilli()
		// Old rows all over the key space of the bank's record names, and
		// last, in both the key's order and the write time's, the one a
		// transaction holds.
		prefix := b.record0()
		for _, c := range "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz" {
			oldRows(t, d, b.outcomes, prefix+string(c), 40, old)
		}
		held := prefix + "~"
		must(t, exec(d.DB, d.Dialect.Bind(fmt.Sprintf(
			"INSERT INTO %s (record_key, fingerprint, fence, state, status, header, body, written_ms) VALUES ('%s', '', 1, 'done', 201, '{}', NULL, %d)",
			b.outcomes, held, old+1))))
		tx, err := d.BeginTx(ctx, nil)
		must(t, err)
		defer tx.Rollback()
		var state string
		must(t, tx.QueryRowContext(ctx, d.Dialect.Bind("SELECT state FROM "+b.outcomes+" WHERE record_key = ? FOR UPDATE"), held).Scan(&state))

		purged := make(chan error, 1)
		go func() {
			_, err := b.store.Purge(ctx, time.Now().Add(-time.Hour))
			purged <- err
		}()
		waitForLockWait(t, d, "DELETE", purged)
		for i := range 3 {
			if r := b.post(fmt.Sprint("new-", i), 2); r.status != 201 {
				t.Fatalf("a new key's transfer during the purge answered %d %s", r.status, r.problem)
			}
		}
		must(t, tx.Rollback())
		if err := <-purged; err != nil {
			t.Fatal(err)
		}
		var left int
		must(t, d.QueryRow("SELECT COUNT(*) FROM "+b.outcomes).Scan(&left))
		if left != 4 {
			t.Fatalf("%d rows left after the purge; want the 4 new transfers'", left)
		}
	})
}

// record0 is the bank's record-name prefix: its key tag without the key.
func (b *bank) record0() string {
	if r := b.post("first", 1); r.status != 201 {
		b.t.Fatalf("first: %+v", r)
	}
	rec := b.record("first")
	return rec[:len(rec)-len("xxxxxxxxxxxxxxxxxxxxxx}:r")]
}

// waitForLockWait returns once a statement starting with verb waits for a
// lock, or fails t when done says the statement ended first.
func waitForLockWait(t *testing.T, d *sqltest.DB, verb string, done <-chan error) {
	t.Helper()
	q := "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1"
	if d.Kind == sqltest.MySQL {
		q = "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?"
	}
	for {
		var n int
		must(t, d.QueryRow(q, verb+"%").Scan(&n))
		if n > 0 {
			return
		}

		select {
		case err := <-done:
			t.Fatalf("the %s ended without waiting (%v)", verb, err)
		case <-time.After(lockPoll(d.Kind)):
		}
	}
}

// lockPoll is how often to ask whether a statement waits for a lock.
// InnoDB refreshes INFORMATION_SCHEMA.INNODB_TRX only when it was last
// read more than 100 ms ago: polled faster, it never changes.
func lockPoll(kind sqltest.Kind) time.Duration {
	if kind == sqltest.MySQL {
		return 150 * time.Millisecond
	}
	return 5 * time.Millisecond
}

// TestPurgeMeasure measures commits of new keys while Purge deletes
// SQLIDEM_PURGE_ROWS old rows (skipped without it): a million takes
// minutes to write. It reports latencies; it asserts only that every
// commit and the purge succeeded.
//
//	SQLIDEM_PURGE_ROWS=1000000 go test -run TestPurgeMeasure -v -timeout 60m
func TestPurgeMeasure(t *testing.T) {
	rows, _ := strconv.Atoi(os.Getenv("SQLIDEM_PURGE_ROWS"))
	if rows <= 0 {
		t.Skip("set SQLIDEM_PURGE_ROWS (1000000 for the documented figures) to measure")
	}
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		b := newBank(t, d)
		prefix := b.record0()
		began := time.Now()
		oldRows(t, d, b.outcomes, prefix, rows, time.Now().Add(-48*time.Hour).UnixMilli())
		t.Logf("%s: %d old rows written in %v", d.Kind, rows, time.Since(began).Round(time.Millisecond))

		commit := func(key string) time.Duration {
			start := time.Now()
			if r := b.post(key, 1); r.status != 201 {
				t.Errorf("%s: %d %s", key, r.status, r.problem)
			}
			return time.Since(start)
		}
		var baseline []time.Duration
		for i := range 50 {
			baseline = append(baseline, commit(fmt.Sprint("before-", i)))
		}

		var mu sync.Mutex
		var during []time.Duration
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					took := commit(fmt.Sprintf("during-%d-%d", w, i))
					mu.Lock()
					during = append(during, took)
					mu.Unlock()
				}
			})
		}
		start := time.Now()
		n, err := b.store.Purge(context.Background(), time.Now().Add(-time.Hour))
		took := time.Since(start)
		close(stop)
		wg.Wait()
		must(t, err)
		if n != int64(rows) {
			t.Errorf("purged %d rows; want %d", n, rows)
		}
		t.Logf("%s: purged %d rows in %v; %d commits meanwhile: p50 %v, p99 %v, max %v; before the purge: p50 %v, max %v",
			d.Kind, n, took.Round(time.Millisecond), len(during),
			pct(during, 50), pct(during, 99), pct(during, 100), pct(baseline, 50), pct(baseline, 100))
	})
}

// pct is the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p)/100)].Round(100 * time.Microsecond)
}
