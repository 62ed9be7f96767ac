package optimistic

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqldialect"
	"github.com/stretchr/testify/require"
)

// An isolation is one way a caller's transaction may run: an isolation
// level on PostgreSQL and MySQL, a locking mode of BEGIN on SQLite (whose
// transactions are always serializable; the driver ignores levels).
type isolation struct {
	name  string
	opts  *sql.TxOptions
	db    *sql.DB // the pool whose transactions run this way
	other *sql.DB // the newer executor's pool: autocommit, another connection
	// readOther: the transaction's first read is of another row. Under
	// MySQL's SERIALIZABLE a plain read locks the row it reads, so the
	// newer executor would wait for the transaction instead of writing
	// first; a read of another row still opens the transaction's view.
	readOther bool
	// serialized: the transaction holds the database's write lock from
	// BEGIN (SQLite's IMMEDIATE and EXCLUSIVE), so no other writer can
	// commit while it is open, and a write inside it is never stale.
	serialized bool
	// refused: the database itself refuses to write a row that changed
	// after the transaction's snapshot (PostgreSQL's REPEATABLE READ and
	// SERIALIZABLE: SQLSTATE 40001; SQLite's DEFERRED: SQLITE_BUSY_SNAPSHOT),
	// before FencedUpdate can compare tokens. The transaction cannot commit;
	// run again, it gets ErrStaleFence.
	refused bool
}

// isolations lists every isolation the backend has.
func isolations(t *testing.T, b backend, d *sqltest.DB, db *sql.DB) []isolation {
	switch b.kind {
	case sqltest.SQLite:
		var out []isolation
		for _, mode := range []string{"deferred", "immediate", "exclusive"} {
			pool, err := sql.Open(d.Driver, strings.Replace(d.DSN, "_txlock=immediate", "_txlock="+mode, 1))
			require.NoError(t, err)
			t.Cleanup(func() { pool.Close() })
			out = append(out, isolation{name: mode, db: pool, other: db, serialized: mode != "deferred", refused: mode == "deferred"})
		}
		return out
	case sqltest.PostgreSQL:
		return []isolation{
			{name: "read-committed", opts: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, db: db, other: db},
			{name: "repeatable-read", opts: &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, db: db, other: db, refused: true},
			{name: "serializable", opts: &sql.TxOptions{Isolation: sql.LevelSerializable}, db: db, other: db, refused: true},
		}
	}
	return []isolation{
		{name: "read-committed", opts: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, db: db, other: db},
		{name: "repeatable-read", opts: &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, db: db, other: db},
		{name: "serializable", opts: &sql.TxOptions{Isolation: sql.LevelSerializable}, db: db, other: db, readOther: true},
	}
}

// A fenced write by a token older than the row's fails under every
// isolation of every database, inside a transaction and outside one: a
// stale executor is never told that its write landed. Token 100 writes,
// then token 200 (the executor that took the key over) writes, and 100
// writes again.
func TestFencedUpdateIsStaleUnderEveryIsolation(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			d := sqltest.Open(t, b.kind)
			db := d.DB
			if b.foundRows {
				db = openFoundRows(t, d.DSN)
			}
			td := &testDB{name: b.name, dialect: b.dialect, db: db}
			for _, iso := range isolations(t, b, d, db) {
				t.Run(iso.name, func(t *testing.T) { fenceScenarios(t, td, iso) })
			}
		})
	}
}

func fenceScenarios(t *testing.T, d *testDB, iso isolation) {
	ctx := t.Context()
	// fresh returns a table whose row 1 token 100 has written, and row 2.
	fresh := func(t *testing.T) Table {
		tbl := d.accounts(t, map[int64]int64{1: 10, 2: 20})
		require.NoError(t, tbl.FencedUpdate(ctx, d.db, 1, 100, Set("owner", "old")))
		return tbl
	}
	newer := func(t *testing.T, tbl Table) error {
		return tbl.FencedUpdate(ctx, iso.other, 1, 200, Set("owner", "new"))
	}
	begin := func(t *testing.T, tbl Table) *sql.Tx {
		tx, err := iso.db.BeginTx(ctx, iso.opts)
		require.NoError(t, err)
		t.Cleanup(func() { tx.Rollback() })
		// The stale executor's transaction reads before it writes, as a
		// handler does: the read opens its snapshot.
		id := 1
		if iso.readOther {
			id = 2
		}
		var balance int64
		require.NoError(t, tx.QueryRowContext(ctx, d.rebind("SELECT balance FROM "+tbl.Name+" WHERE id = ?"), id).Scan(&balance))
		return tx
	}
	stale := func(t *testing.T, err error, tbl Table) {
		t.Helper()
		require.ErrorIs(t, err, ErrStaleFence)
		var e *StaleFenceError
		require.ErrorAs(t, err, &e)
		require.Equal(t, uint64(200), e.Current, "the fence is the newer executor's")
		require.Equal(t, "new", d.row(t, tbl, 1).owner.String)
	}

	t.Run("outside a transaction", func(t *testing.T) {
		tbl := fresh(t)
		require.NoError(t, newer(t, tbl))
		stale(t, tbl.FencedUpdate(ctx, d.db, 1, 100, Set("owner", "stale")), tbl)
	})

	t.Run("transaction begun after the newer write", func(t *testing.T) {
		tbl := fresh(t)
		require.NoError(t, newer(t, tbl))
		tx := begin(t, tbl)
		stale(t, tbl.FencedUpdate(ctx, tx, 1, 100, Set("owner", "stale")), tbl)
	})

	t.Run("newer write inside the transaction's life", func(t *testing.T) {
		tbl := fresh(t)
		tx := begin(t, tbl)
		if iso.serialized {
			// The newer executor waits for the transaction's write lock:
			// the stale write is first in the database's order, so it is
			// not stale, and the newer one lands on top of it.
			done := make(chan error, 1)
			go func() { done <- newer(t, tbl) }()
			require.NoError(t, tbl.FencedUpdate(ctx, tx, 1, 100, Set("owner", "first")))
			require.NoError(t, tx.Commit())
			require.NoError(t, <-done)
			require.Equal(t, row{balance: 10, owner: sql.NullString{String: "new", Valid: true}, fence: 200}, d.row(t, tbl, 1))
			return
		}
		require.NoError(t, newer(t, tbl), "the transaction holds no lock that the newer write needs")
		// The report: MySQL at REPEATABLE READ re-read the fence through
		// the transaction's snapshot, found its own token there, and
		// answered nil.
		err := tbl.FencedUpdate(ctx, tx, 1, 100, Set("owner", "stale"))
		require.Error(t, err, "a stale executor was told its fenced write landed")
		if !iso.refused {
			stale(t, err, tbl)
			return
		}
		require.True(t, sqldialect.Retryable(err), "want the database's serialization failure, got %v", err)
		require.NotErrorIs(t, err, ErrStaleFence)
		require.NoError(t, tx.Rollback())
		require.Equal(t, "new", d.row(t, tbl, 1).owner.String)
		// Run again, as a transaction that failed to serialize is.
		again := begin(t, tbl)
		stale(t, tbl.FencedUpdate(ctx, again, 1, 100, Set("owner", "stale")), tbl)
	})
}
