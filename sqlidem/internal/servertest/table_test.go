package servertest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
)

// Every instance may call CreateTable at start-up, at the same moment.
func TestConcurrentCreateTable(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for round := range 3 {
			table := d.Table(t, "outcomes")
			s, err := newStore(d, table)
			must(t, err)
			start := make(chan struct{})
			errs := make(chan error, 8)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					<-start
					errs <- s.CreateTable(t.Context())
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("round %d: concurrent CreateTable: %v", round, err)
				}
			}
			if !hasWrittenIndex(t, d, table) {
				t.Fatal("no index on written_ms")
			}
		}
	})
}

// A table created by an earlier version, without the index on the write
// time, gets it from CreateTable.
func TestCreateTableIndexesAnOldTable(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		table := d.Table(t, "outcomes")
		key := map[sqltest.Kind]string{sqltest.MySQL: "VARBINARY(512)"}[d.Kind]
		if key == "" {
			key = "TEXT"
		}
		must(t, exec(d.DB, fmt.Sprintf(`CREATE TABLE %s (record_key %s PRIMARY KEY, fingerprint VARCHAR(64) NOT NULL,
	fence BIGINT NOT NULL, state VARCHAR(8) NOT NULL, status INTEGER NOT NULL, header TEXT NOT NULL,
	body %s, written_ms BIGINT NOT NULL)`, table, key, map[bool]string{true: "BYTEA", false: "BLOB"}[d.Kind == sqltest.PostgreSQL])))
		s, err := newStore(d, table)
		must(t, err)
		if hasWrittenIndex(t, d, table) {
			t.Fatal("the old table has the index already")
		}
		must(t, s.CreateTable(t.Context()))
		must(t, s.CreateTable(t.Context()))
		if !hasWrittenIndex(t, d, table) {
			t.Fatal("CreateTable left the old table without an index on written_ms")
		}
	})
}

// hasWrittenIndex reports whether table has an index on written_ms.
func hasWrittenIndex(t *testing.T, d *sqltest.DB, table string) bool {
	t.Helper()
	q := map[sqltest.Kind]string{
		sqltest.SQLite:     "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql LIKE '%written_ms%'",
		sqltest.PostgreSQL: "SELECT COUNT(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(written_ms)%'",
		sqltest.MySQL: "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() " +
			"AND TABLE_NAME = ? AND COLUMN_NAME = 'written_ms' AND SEQ_IN_INDEX = 1",
	}[d.Kind]
	var n int
	must(t, d.QueryRowContext(t.Context(), q, table).Scan(&n))
	return n > 0
}

// oldRows writes n rows last written at written_ms, keyed prefix0000001…,
// in one statement.
func oldRows(t *testing.T, d *sqltest.DB, table, prefix string, n int, writtenMS int64) {
	t.Helper()
	var q string
	switch d.Kind {
	case sqltest.PostgreSQL:
		q = `INSERT INTO ` + table + ` (record_key, fingerprint, fence, state, status, header, body, written_ms)
	SELECT $1 || lpad(g::text, 7, '0'), '', 1, 'done', 201, '{}', NULL, $2 FROM generate_series(1, $3) g`
	case sqltest.MySQL:
		// MySQL stops recursion at 1,000 rows: powers of ten by joins.
		sum, from := "1", ""
		for i, scale := 0, 1; scale < n; i, scale = i+1, scale*10 {
			sum += fmt.Sprintf(" + %d*d%d.d", scale, i)
			from += fmt.Sprintf(", digits d%d", i)
		}
		q = `INSERT INTO ` + table + ` (record_key, fingerprint, fence, state, status, header, body, written_ms)
	WITH RECURSIVE digits(d) AS (SELECT 0 UNION ALL SELECT d + 1 FROM digits WHERE d < 9),
	numbers(n) AS (SELECT ` + sum + ` FROM ` + from[2:] + `)
	SELECT CONCAT(?, LPAD(n, 7, '0')), '', 1, 'done', 201, '{}', NULL, ? FROM numbers WHERE n <= ?`
	default:
		q = `WITH RECURSIVE numbers(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM numbers WHERE n < ?3)
	INSERT INTO ` + table + ` (record_key, fingerprint, fence, state, status, header, body, written_ms)
	SELECT ?1 || printf('%07d', n), '', 1, 'done', 201, '{}', NULL, ?2 FROM numbers`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := d.ExecContext(ctx, q, prefix, writtenMS, n)
	must(t, err)
}
