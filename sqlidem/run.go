package sqlidem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/onceonly/idempotency"
)

// ErrAlreadyCommitted is what a second Run (or Handler) in one protected
// execution gets: the key's one row holds the first one's result, and a
// second could only be handed that. Its function does not run. Put all
// of an execution's writes in one Run.
var ErrAlreadyCommitted = errors.New("sqlidem: this execution has committed its result already; call Run once per function run by Do")

// Run is Handler for a function protected by idempotency.Do: call it
// inside the function given to Do, with Do's context. It runs fn in a
// transaction and commits fn's result in the same transaction, in a row
// keyed by Do's key, encoded with Do's codec (idempotency.UseCodec):
//
//	receipt, err := idempotency.Do(ctx, durable, key, func(ctx context.Context) (Receipt, error) {
//		return sqlidem.Run(ctx, outcomes, func(ctx context.Context, tx *sql.Tx) (Receipt, error) {
//			return charge(ctx, tx, msg)
//		})
//	})
//
// A result committed already is returned without running fn; a result
// committed for different input under the key is refused as
// idempotency.ErrKeyReused. When fn fails, or the commit does, nothing
// commits, the key is released (idempotency.Release) even under
// idempotency.StoreErrors, and the error is returned. A stale execution,
// fenced out by a newer one, gets idempotency.ErrInProgress. A
// transaction the database aborts as a serialization failure or a
// deadlock runs again, fn included (see WithAttempts); a step
// (idempotency.Step) an earlier attempt finished returns its result to the
// attempt that runs again, without running.
//
// fn must leave tx's end to Run: after fn's own tx.Commit or tx.Rollback,
// Run returns ErrOutcomeUnknown, and so does every later Run for the key,
// without running fn.
//
// Call Run once per function given to Do: the key has one row, and it
// holds the first Run's result. A second Run in the same call returns
// ErrAlreadyCommitted and runs nothing (Do then releases the key, unless
// StoreErrors, and a redelivery's second Run would be handed the first
// one's result; where Do's keys live in the same database, the first
// Run's result is the key's answer already, and a redelivery gets it).
// Put all of a call's writes in one Run.
//
// Outside Do (no protected execution in ctx), fn runs in a transaction
// with no outcome row.
func Run[T any](ctx context.Context, s *Store, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var zero T
	exec, protected := idempotency.ExecutionOf(ctx)
	if !protected {
		return runUnprotected(ctx, s, fn)
	}
	codec := exec.Codec // Do's: a recovered row must decode as Do's own record
	if codec == nil {
		return zero, errors.New("sqlidem: Run outside a function run by idempotency.Do (use Handler for a handler)")
	}
	var result T
	attempt := ctx
	o := s.commitOnce(ctx, exec, func(tx *sql.Tx) (idempotency.Answer, error) {
		v, err := fn(attempt, tx)
		if err != nil {
			return idempotency.Answer{}, err
		}
		result = v
		body, err := codec.Marshal(v)
		if err == nil && len(body) > answerLimit(exec) {
			// Not replayable for its size (the store keeps no body past
			// the limit), and so not decoded again for the round-trip
			// check, which would cost a copy as large as the result.
			err = idempotency.ErrNotReplayable
		}
		if err == nil {
			err = idempotency.CheckResult(codec, v, body)
		}
		// The status Do stores a result under, so that a recovered row
		// reads as Do's own. A result that would not come back as it was
		// commits as executed, not replayable, as Do keeps it: fn's
		// writes are done, and a redelivery must neither run it again nor
		// find the row unreadable.
		return idempotency.Answer{Status: http.StatusOK, Body: body, NotReplayable: err != nil}, nil
	}, func() { attempt = idempotency.NextAttempt(ctx) })
	switch o.verdict {
	case committed:
		return result, nil
	case replayed:
		if o.answer.NotReplayable {
			return zero, idempotency.ErrNotReplayable
		}
		if o.answer.Status != http.StatusOK {
			return zero, errors.Join(idempotency.ErrUnreadableRecord,
				fmt.Errorf("sqlidem: committed status %d is not a function's result", o.answer.Status))
		}
		var v T
		if err := codec.Unmarshal(o.answer.Body, &v); err != nil {
			return zero, errors.Join(idempotency.ErrUnreadableRecord, err)
		}
		return v, nil
	case unsettled:
		return zero, o.err // the key is kept: the commit may yet land
	}
	idempotency.Release(ctx)
	return zero, o.err
}

func runUnprotected[T any](ctx context.Context, s *Store, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return zero, unavailable(err)
	}
	defer tx.Rollback()
	v, err := fn(ctx, tx)
	if err != nil {
		return zero, err
	}
	if err := tx.Commit(); err != nil {
		return zero, commitFailed(err)
	}
	return v, nil
}
