// Package sqltables is what the example's own SQL tables share when the
// shop keeps its data in a database instead of Redis (IDEMPOTENCY_STORE):
// creating them, writing a row unless it exists, and the fenced write that
// creates its row, as a Redis hash's FencedSet does.
package sqltables

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/onceonly/idempotency/optimistic"
	"github.com/onceonly/idempotency/sqldialect"
)

// Create runs ddl, CREATE TABLE IF NOT EXISTS statements, in one
// transaction. Two PostgreSQL sessions that create one table at the same
// moment collide, IF NOT EXISTS or not (a unique violation in its
// catalog): there the instances take turns, under a transaction-scoped
// advisory lock named lock.
func Create(ctx context.Context, db *sql.DB, d sqldialect.Dialect, lock string, ddl ...string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if d == sqldialect.PostgreSQL {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", lock); err != nil {
			return err
		}
	}
	for _, stmt := range ddl {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// TableOptions ends a CREATE TABLE: on MySQL, a character set that holds
// any text a client sends (MariaDB's default may be latin1).
func TableOptions(d sqldialect.Dialect) string {
	if d == sqldialect.MySQL {
		return " DEFAULT CHARSET=utf8mb4"
	}
	return ""
}

// InsertIfAbsent is the statement that inserts one row into table unless
// a row with its key exists, with ? placeholders bound for d. The rows it
// affects (1 or 0) tell which.
func InsertIfAbsent(d sqldialect.Dialect, table, key string, columns ...string) string {
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(columns)), ", ")
	list := strings.Join(columns, ", ")
	if d == sqldialect.MySQL {
		return "INSERT IGNORE INTO " + table + " (" + list + ") VALUES (" + marks + ")"
	}
	return d.Bind("INSERT INTO " + table + " (" + list + ") VALUES (" + marks + ") ON CONFLICT (" + key + ") DO NOTHING")
}

// FencedPut writes set to the row id of t under token, creating the row
// when it is missing, as optimistic.Hash.FencedSet does for a hash: a
// token below the row's fence is refused with optimistic.ErrStaleFence and
// nothing is written. set must give every NOT NULL column of the table
// other than its id and fence. A transaction the database refuses as a
// conflict (a deadlock, a serialization failure) runs again.
func FencedPut(ctx context.Context, db *sql.DB, t optimistic.Table, id any, token uint64, set ...optimistic.Assignment) error {
	if token == 0 {
		return optimistic.ErrNoFencingToken
	}
	idColumn, fence := orDefault(t.ID, "id"), orDefault(t.Fence, "fence")
	columns, values := []string{idColumn, fence}, []any{id, 0}
	for _, a := range set {
		columns = append(columns, a.Column)
		values = append(values, a.Value)
	}
	// The row exists, at fence 0, before the fenced update decides.
	insert := InsertIfAbsent(t.Dialect, t.Name, idColumn, columns...)
	var err error
	for range 5 {
		if err = fencedPut(ctx, db, t, insert, values, id, token, set); !sqldialect.Retryable(err) {
			return err
		}
	}
	return fmt.Errorf("sqltables: fenced write of %s id %v kept conflicting: %w", t.Name, id, err)
}

func fencedPut(ctx context.Context, db *sql.DB, t optimistic.Table, insert string, values []any, id any, token uint64, set []optimistic.Assignment) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, insert, values...); err != nil {
		return err
	}
	if err := t.FencedUpdate(ctx, tx, id, token, set...); err != nil {
		return err
	}
	return tx.Commit()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
