package servertest_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// A key prefix long enough to overflow record_key (MySQL's VARBINARY(512);
// PostgreSQL's B-tree takes some 2,700 bytes, compressed) still names one row per
// key: the transfer commits once, replays from Redis and from SQL, and
// its abandoned execution is recovered. Before, MySQL refused the row
// (or, outside strict mode, cut it short, so that long keys met) and
// PostgreSQL refused the index entry: every attempt ran, and failed.
func TestLongKeyPrefix(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		// Random, so that PostgreSQL cannot compress it under its limit.
		random := make([]byte, 4000)
		rand.Read(random)
		prefix := "sqlidem-long-" + string(d.Kind) + "-" + hex.EncodeToString(random)
		b := newBank(t, d, idempotency.WithKeyPrefix(prefix))
		first := b.post("k1", 5)
		if first.status != 201 {
			t.Fatalf("first: %d %s", first.status, first.problem)
		}
		if len(b.record("k1")) <= sqlidem.MaxKeyBytes {
			t.Fatalf("the record's name is %d bytes; the test wants one over %d", len(b.record("k1")), sqlidem.MaxKeyBytes)
		}
		row, ok, err := b.store.Lookup(t.Context(), b.record("k1"))
		must(t, err)
		if !ok || !row.Done || string(row.Answer.Body) != first.body {
			t.Fatalf("Lookup of the long key: %+v (found %v)", row, ok)
		}
		if r := b.post("k1", 5); !r.replayed || r.body != first.body {
			t.Fatalf("replay from Redis: %+v", r)
		}
		must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
		if r := b.post("k1", 5); !r.replayed || r.body != first.body {
			t.Fatalf("replay from SQL: %+v", r)
		}
		b.abandon("k1")
		if r := b.post("k1", 5); !r.replayed || r.body != first.body {
			t.Fatalf("recovery: %+v", r)
		}
		// Two long keys that differ only past the first bytes are two rows.
		if r := b.post("k2", 6); r.status != 201 || r.replayed {
			t.Fatalf("second key: %+v", r)
		}
		if b.runs.Load() != 2 {
			t.Fatalf("transfers ran %d times; want 2", b.runs.Load())
		}
	})
}
