package optimistic

import (
	"errors"
	"fmt"
)

// Sentinel errors, matched with errors.Is. The helpers return the typed
// errors below, which match these, so callers that need the numbers reach
// them with errors.As.
var (
	// ErrConflict means a write's expectation did not hold: the row or hash
	// is at another version than the caller read, or it is gone. Re-read and
	// try again (Retry does exactly that for a function that re-reads).
	ErrConflict = errors.New("optimistic: conflict")
	// ErrNotFound means the row or hash does not exist. A versioned write
	// to a missing row matches both ErrNotFound and ErrConflict.
	ErrNotFound = errors.New("optimistic: not found")
	// ErrStaleFence means the storage already accepted a write with this
	// fencing token or a higher one: another execution took the key over,
	// and this one must not write. It is not a conflict; retrying is wrong.
	ErrStaleFence = errors.New("optimistic: stale fencing token")
	// ErrNoFencingToken means a fenced write got token 0, which is what
	// idempotency.FencingToken returns outside a protected execution.
	ErrNoFencingToken = errors.New("optimistic: no fencing token")
)

// ConflictError is the error of a versioned write that did not apply. It
// matches ErrConflict, and also ErrNotFound when Missing is set.
type ConflictError struct {
	// Resource names what was written, for messages: "accounts id 7",
	// "hash acct:7".
	Resource string
	// Expected is the version the write required.
	Expected int64
	// Current is the version found instead. It is 0 when Missing, and -1
	// when the follow-up read of a SQL row failed (that read's error is
	// joined to this one).
	Current int64
	// Missing reports that the row or hash does not exist.
	Missing bool
	// Snapshot reports that the write ran in a transaction whose reads
	// see the row as it was before the version that refused the write
	// (MySQL's and MariaDB's REPEATABLE READ, their default): the row
	// still reads at Expected there, so no retry inside that transaction
	// can succeed. Retry returns such a conflict at once, and it reports
	// SQLSTATE 40001 (SQLState), as a serialization failure does, so that
	// what runs the transaction again from BEGIN on a 40001 (sqlidem's
	// WithAttempts, a loop of your own) does so, with a fresh snapshot.
	Snapshot bool
}

// SQLState is "40001", serialization failure, for a conflict that only a
// new transaction can get past (Snapshot), and "" otherwise.
func (e *ConflictError) SQLState() string {
	if e.Snapshot {
		return "40001"
	}
	return ""
}

func (e *ConflictError) Error() string {
	switch {
	case e.Missing:
		return fmt.Sprintf("optimistic: conflict: %s does not exist (expected version %d)", e.Resource, e.Expected)
	case e.Current < 0:
		return fmt.Sprintf("optimistic: conflict: %s is not at version %d", e.Resource, e.Expected)
	}
	if e.Snapshot {
		return fmt.Sprintf("optimistic: conflict: %s is no longer at version %d, which the transaction's snapshot "+
			"still reads; run the whole transaction again (SQLSTATE 40001)", e.Resource, e.Expected)
	}
	return fmt.Sprintf("optimistic: conflict: %s is at version %d, not %d", e.Resource, e.Current, e.Expected)
}

// Is makes errors.Is(err, ErrConflict) hold, and errors.Is(err, ErrNotFound)
// for a missing row or hash.
func (e *ConflictError) Is(target error) bool {
	return target == ErrConflict || (e.Missing && target == ErrNotFound)
}

// StaleFenceError is the error of a fenced write that was refused because
// the storage holds a token at least as high. It matches ErrStaleFence.
type StaleFenceError struct {
	// Resource names what was written: "orders id 7", "hash order:7".
	Resource string
	// Token is the writer's fencing token.
	Token uint64
	// Current is the token the storage holds.
	Current uint64
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("optimistic: stale fencing token: %s holds token %d, the write carried %d",
		e.Resource, e.Current, e.Token)
}

// Is makes errors.Is(err, ErrStaleFence) hold.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }
