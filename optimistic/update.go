package optimistic

import (
	"context"
	"errors"
	"fmt"
)

// Update writes set to the row id only if the row is still at version
// expected, and increments its version in the same statement:
//
//	UPDATE name SET set…, version = version + 1 WHERE id = ? AND version = ?
//
// It returns the new version, expected+1. When no row matched it reads the
// row once more to say why, and returns a *ConflictError matching
// ErrConflict: with Missing set (matching ErrNotFound too) when the row is
// gone, else with the version it is at now. Inside a REPEATABLE READ
// transaction (MySQL's default) that read sees the transaction's snapshot,
// which may still hold the row at expected: then no read in the
// transaction can see the version that refused the write, the conflict's
// Snapshot is set, Retry gives up at once, and the error reports SQLSTATE
// 40001 so that the whole transaction runs again (sqlidem does, see
// WithAttempts). PostgreSQL at REPEATABLE READ or above refuses a
// concurrent update with a serialization error (SQLSTATE 40001) itself,
// which does not match ErrConflict: retry the transaction.
//
// set may be empty, which only bumps the version. It must not name the id,
// version or fence column: the fence is FencedUpdate's to keep, and a
// write that set it could let a stale executor's write through. Any other
// error (a bad name, the driver's) does not match ErrConflict, so Retry
// stops on it.
func (t Table) Update(ctx context.Context, db Querier, id any, expected int64, set ...Assignment) (int64, error) {
	if expected < 0 {
		return 0, fmt.Errorf("optimistic: %s: negative expected version %d", t.Name, expected)
	}
	q, err := t.quoted()
	if err != nil {
		return 0, err
	}
	bump := func(s *statement) string {
		return q.version + " = COALESCE(" + q.version + ", 0) + 1"
	}
	matches := func(s *statement) string {
		return "COALESCE(" + q.version + ", 0) = " + s.param(expected)
	}
	s, err := q.update(id, set, []string{q.raw.ID, q.raw.Version, q.raw.Fence}, bump, matches)
	if err != nil {
		return 0, err
	}
	n, err := exec(ctx, db, s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("optimistic: updating %s: %w", q.resource(id), err)
	case n == 1:
		return expected + 1, nil
	case n > 1:
		return 0, fmt.Errorf("optimistic: updating %s changed %d rows; %s must be unique", q.resource(id), n, q.raw.ID)
	}
	conflict := &ConflictError{Resource: q.resource(id), Expected: expected}
	current, found, err := q.current(ctx, db, q.version, id, false)
	if err != nil {
		conflict.Current = -1
		return 0, errors.Join(conflict, fmt.Errorf("optimistic: reading the version of %s: %w", q.resource(id), err))
	}
	// The UPDATE read the latest row, and it was not at expected; a read
	// that still finds expected reads a snapshot from before that row.
	conflict.Current, conflict.Missing, conflict.Snapshot = current, !found, found && current == expected
	return 0, conflict
}
