package optimistic

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidName(t *testing.T) {
	long := strings.Repeat("a", maxIdentifier)
	for _, tc := range []struct {
		name      string
		qualified bool
		ok        bool
	}{
		{"accounts", false, true},
		{"_private2", false, true},
		{"Mixed_Case", false, true},
		{long, false, true},
		{long + "a", false, false},
		{"billing.invoices", true, true},
		{"billing.invoices", false, false},
		{"a.b.c", true, false},
		{".accounts", true, false},
		{"accounts.", true, false},
		{"", false, false},
		{"1accounts", false, false},
		{"accounts;DROP TABLE users", true, false},
		{`accounts"--`, false, false},
		{"acc`ounts", false, false},
		{"acc'ounts", false, false},
		{"acc ounts", false, false},
		{"acc-ounts", false, false},
		{"accöunts", false, false},
		{"acc\x00ounts", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validName(tc.name, tc.qualified)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

func TestStatementsPerDialect(t *testing.T) {
	set := []Assignment{Set("owner", "ann"), Set("order", 7)}
	for _, tc := range []struct {
		dialect       Dialect
		update, fence string
	}{
		{SQLite,
			`UPDATE "billing"."accounts" SET "owner" = ?, "order" = ?, "rev" = COALESCE("rev", 0) + 1 WHERE "account_id" = ? AND COALESCE("rev", 0) = ?`,
			`UPDATE "billing"."accounts" SET "owner" = ?, "order" = ?, "token" = ? WHERE "account_id" = ? AND COALESCE("token", 0) <= ?`},
		{PostgreSQL,
			`UPDATE "billing"."accounts" SET "owner" = $1, "order" = $2, "rev" = COALESCE("rev", 0) + 1 WHERE "account_id" = $3 AND COALESCE("rev", 0) = $4`,
			`UPDATE "billing"."accounts" SET "owner" = $1, "order" = $2, "token" = $3 WHERE "account_id" = $4 AND COALESCE("token", 0) <= $5`},
		{MySQL,
			"UPDATE `billing`.`accounts` SET `owner` = ?, `order` = ?, `rev` = COALESCE(`rev`, 0) + 1 WHERE `account_id` = ? AND COALESCE(`rev`, 0) = ?",
			"UPDATE `billing`.`accounts` SET `owner` = ?, `order` = ?, `token` = ? WHERE `account_id` = ? AND COALESCE(`token`, 0) <= ?"},
	} {
		t.Run(tc.dialect.String(), func(t *testing.T) {
			tbl := Table{Dialect: tc.dialect, Name: "billing.accounts", ID: "account_id", Version: "rev", Fence: "token"}
			db := &recorder{}
			_, err := tbl.Update(t.Context(), db, 42, 3, set...)
			require.NoError(t, err)
			require.Equal(t, tc.update, db.query)
			require.Equal(t, []any{"ann", 7, 42, int64(3)}, db.args)

			require.NoError(t, tbl.FencedUpdate(t.Context(), db, 42, 9, set...))
			require.Equal(t, tc.fence, db.query)
			require.Equal(t, []any{"ann", 7, int64(9), 42, int64(9)}, db.args)
		})
	}
}

func TestInvalidTables(t *testing.T) {
	ok := Table{Dialect: SQLite, Name: "accounts"}
	for _, tc := range []struct {
		name string
		tbl  Table
		set  []Assignment
		want string
	}{
		{"no dialect", Table{Name: "accounts"}, nil, "no valid Dialect"},
		{"unknown dialect", Table{Dialect: 9, Name: "accounts"}, nil, "Dialect(9)"},
		{"no name", Table{Dialect: SQLite}, nil, "invalid SQL name"},
		{"injected table", Table{Dialect: SQLite, Name: "a; DROP TABLE b"}, nil, "invalid SQL name"},
		{"injected id column", Table{Dialect: SQLite, Name: "a", ID: `id" OR 1=1 --`}, nil, "invalid SQL name"},
		{"injected version column", Table{Dialect: MySQL, Name: "a", Version: "v`"}, nil, "invalid SQL name"},
		{"injected fence column", Table{Dialect: PostgreSQL, Name: "a", Fence: "f f"}, nil, "invalid SQL name"},
		{"injected set column", ok, []Assignment{Set("balance = 0, owner", 1)}, "invalid SQL name"},
		{"sets the id", ok, []Assignment{Set("ID", 1)}, "managed by the helper"},
		{"sets a column twice", ok, []Assignment{Set("owner", 1), Set("Owner", 2)}, "set twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := &recorder{}
			_, err := tc.tbl.Update(t.Context(), db, 1, 0, tc.set...)
			require.ErrorContains(t, err, tc.want)
			require.NotErrorIs(t, err, ErrConflict)
			err = tc.tbl.FencedUpdate(t.Context(), db, 1, 1, tc.set...)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, db.query, "nothing reached the database")
		})
	}
	t.Run("sets the guard column", func(t *testing.T) {
		db := &recorder{}
		_, err := ok.Update(t.Context(), db, 1, 0, Set("version", 5))
		require.ErrorContains(t, err, "managed by the helper")
		require.ErrorContains(t, ok.FencedUpdate(t.Context(), db, 1, 1, Set("fence", 5)), "managed by the helper")
		require.Empty(t, db.query)
	})
	// A versioned write that reset the fence would let a stale executor's
	// fenced write through; a fenced write that set the version back
	// would let a reader's stale compare-and-set through.
	t.Run("sets the other helper's column", func(t *testing.T) {
		db := &recorder{}
		_, err := ok.Update(t.Context(), db, 1, 0, Set("Fence", 0))
		require.ErrorContains(t, err, "managed by the helper")
		require.ErrorContains(t, ok.FencedUpdate(t.Context(), db, 1, 1, Set("VERSION", 0)), "managed by the helper")
		renamed := Table{Dialect: SQLite, Name: "a", Version: "rev", Fence: "epoch"}
		_, err = renamed.Update(t.Context(), db, 1, 0, Set("epoch", 0))
		require.ErrorContains(t, err, "managed by the helper")
		require.ErrorContains(t, renamed.FencedUpdate(t.Context(), db, 1, 1, Set("rev", 0)), "managed by the helper")
		require.Empty(t, db.query)
	})
}

// recorder is a Querier that remembers the last statement and reports one
// affected row, for checking the SQL the helpers write.
type recorder struct {
	query string
	args  []any
}

func (r *recorder) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	r.query, r.args = query, args
	return driver.RowsAffected(1), nil
}

func (r *recorder) QueryRowContext(context.Context, string, ...any) *sql.Row {
	panic("recorder: no follow-up read expected")
}
