package optimistic

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUpdate(t *testing.T) {
	eachDB(t, func(t *testing.T, d *testDB) {
		tbl := d.accounts(t, map[int64]int64{1: 100})
		ctx := t.Context()

		v, err := tbl.Update(ctx, d.db, 1, 0, Set("balance", 150), Set("owner", "ann"), Set("order", 3))
		require.NoError(t, err)
		require.EqualValues(t, 1, v)
		require.Equal(t, row{balance: 150, owner: sql.NullString{String: "ann", Valid: true}, version: 1}, d.row(t, tbl, 1))

		for _, tc := range []struct {
			name     string
			id       int64
			expected int64
			current  int64
			missing  bool
		}{
			{"stale version", 1, 0, 1, false},
			{"future version", 1, 5, 1, false},
			{"missing row", 2, 1, 0, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := tbl.Update(ctx, d.db, tc.id, tc.expected, Set("balance", -1))
				require.ErrorIs(t, err, ErrConflict)
				require.Equal(t, tc.missing, errors.Is(err, ErrNotFound))
				var conflict *ConflictError
				require.ErrorAs(t, err, &conflict)
				require.Equal(t, ConflictError{Resource: conflict.Resource, Expected: tc.expected,
					Current: tc.current, Missing: tc.missing}, *conflict)
				require.Contains(t, conflict.Error(), tbl.Name)
				require.EqualValues(t, 150, d.row(t, tbl, 1).balance, "a refused write changes nothing")
			})
		}

		t.Run("version only", func(t *testing.T) {
			v, err := tbl.Update(ctx, d.db, 1, 1)
			require.NoError(t, err)
			require.EqualValues(t, 2, v)
			require.Equal(t, row{balance: 150, owner: sql.NullString{String: "ann", Valid: true}, version: 2}, d.row(t, tbl, 1))
		})

		t.Run("null version counts as zero", func(t *testing.T) {
			name := d.createTable(t, "id BIGINT PRIMARY KEY", "version BIGINT", "note VARCHAR(10)")
			d.exec(t, "INSERT INTO "+name+" (id) VALUES (?)", 1)
			v, err := Table{Dialect: d.dialect, Name: name}.Update(ctx, d.db, 1, 0, Set("note", "x"))
			require.NoError(t, err)
			require.EqualValues(t, 1, v)
		})

		t.Run("custom column names", func(t *testing.T) {
			name := d.createTable(t, "key VARCHAR(20) PRIMARY KEY", "rev BIGINT NOT NULL DEFAULT 0", "select VARCHAR(10)")
			custom := Table{Dialect: d.dialect, Name: name, ID: "key", Version: "rev"}
			_, err := d.db.ExecContext(ctx, "INSERT INTO "+name+" ("+d.dialect.Quote("key")+") VALUES ('k')")
			require.NoError(t, err)
			v, err := custom.Update(ctx, d.db, "k", 0, Set("select", "a"))
			require.NoError(t, err)
			require.EqualValues(t, 1, v)
			_, err = custom.Update(ctx, d.db, "k", 0, Set("select", "b"))
			var conflict *ConflictError
			require.ErrorAs(t, err, &conflict)
			require.EqualValues(t, 1, conflict.Current)
		})

		t.Run("negative expected version", func(t *testing.T) {
			_, err := tbl.Update(ctx, d.db, 1, -1)
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrConflict)
		})

		t.Run("driver error is not a conflict", func(t *testing.T) {
			_, err := tbl.Update(ctx, d.db, 1, 2, Set("no_such_column", 1))
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrConflict)
		})
	})
}

// TestUpdateQueriers runs Update through each Querier database/sql offers.
func TestUpdateQueriers(t *testing.T) {
	eachDB(t, func(t *testing.T, d *testDB) {
		tbl := d.accounts(t, map[int64]int64{1: 0})
		ctx := t.Context()
		for i, tc := range []struct {
			name  string
			open  func(t *testing.T) (Querier, func() error)
			after func(t *testing.T)
		}{
			{name: "DB", open: func(*testing.T) (Querier, func() error) { return d.db, func() error { return nil } }},
			{name: "Conn", open: func(t *testing.T) (Querier, func() error) {
				conn, err := d.db.Conn(ctx)
				require.NoError(t, err)
				return conn, conn.Close
			}},
			{name: "Tx", open: func(t *testing.T) (Querier, func() error) {
				tx, err := d.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				return tx, tx.Commit
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				q, done := tc.open(t)
				v, err := tbl.Update(ctx, q, 1, int64(i), Set("balance", i+1))
				require.NoError(t, err)
				require.EqualValues(t, i+1, v)
				_, err = tbl.Update(ctx, q, 1, int64(i), Set("balance", -1))
				var conflict *ConflictError
				require.ErrorAs(t, err, &conflict, "the follow-up read runs on the same %s", tc.name)
				require.EqualValues(t, i+1, conflict.Current)
				require.NoError(t, done())
				require.EqualValues(t, i+1, d.row(t, tbl, 1).balance)
			})
		}

		t.Run("rolled back", func(t *testing.T) {
			tx, err := d.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tbl.Update(ctx, tx, 1, 3, Set("balance", 99))
			require.NoError(t, err)
			require.NoError(t, tx.Rollback())
			require.Equal(t, int64(3), d.row(t, tbl, 1).version)
		})

		t.Run("cancelled context", func(t *testing.T) {
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			_, err := tbl.Update(cancelled, d.db, 1, 3, Set("balance", 99))
			require.ErrorIs(t, err, context.Canceled)
			require.NotErrorIs(t, err, ErrConflict)
		})
	})
}

// A versioned write in a transaction whose snapshot predates the version
// that refused it (MySQL's REPEATABLE READ) cannot succeed by re-reading in
// that transaction: the conflict says so, Retry stops at once, and the
// error is a serialization failure (40001) for whatever reruns the
// transaction.
func TestUpdateInAStaleSnapshot(t *testing.T) {
	eachDB(t, func(t *testing.T, d *testDB) {
		if d.dialect != MySQL {
			t.Skip("a stale snapshot that an UPDATE reads past is MySQL's REPEATABLE READ")
		}
		tbl := d.accounts(t, map[int64]int64{1: 100})
		ctx := t.Context()
		tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		defer tx.Rollback()
		runs := 0
		err = Retry(ctx, Policy{}, func(ctx context.Context) error {
			runs++
			var version int64
			require.NoError(t, tx.QueryRowContext(ctx, "SELECT version FROM "+tbl.Name+" WHERE id = 1").Scan(&version))
			if runs == 1 {
				_, err := tbl.Update(ctx, d.db, 1, version, Set("balance", 90)) // another writer, after the snapshot
				require.NoError(t, err)
			}
			_, err := tbl.Update(ctx, tx, 1, version, Set("balance", 80))
			return err
		})
		require.Equal(t, 1, runs, "Retry ran again in a snapshot that cannot see the new version")
		require.ErrorIs(t, err, ErrConflict)
		var conflict *ConflictError
		require.ErrorAs(t, err, &conflict)
		require.True(t, conflict.Snapshot)
		require.Equal(t, "40001", conflict.SQLState())
		require.NoError(t, tx.Rollback())

		// Outside a transaction, a conflict is an ordinary one.
		_, err = tbl.Update(ctx, d.db, 1, 0, Set("balance", 70))
		require.ErrorAs(t, err, &conflict)
		require.False(t, conflict.Snapshot)
		require.Empty(t, conflict.SQLState())
	})
}
