package sqlidem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/sqldialect"
)

// What became of one execution's transaction.
type verdict int

const (
	committed  verdict = iota + 1 // the work and its answer committed together
	replayed                      // another execution's answer was committed: it answers
	rolledBack                    // the work failed; nothing committed
	refused                       // nothing committed, and the work must not be retried here
	aborted                       // the database aborted the transaction (serialization, deadlock): run it again
	unsettled                     // whether the commit landed is not known yet: the key must be kept
)

type outcome struct {
	verdict verdict
	answer  idempotency.Answer // replayed: the committed answer
	err     error              // rolledBack: the work's error; otherwise why
}

// work does an execution's writes in tx and returns the answer to commit
// with them. It may run more than once: again from BEGIN when the
// database aborted the transaction (see WithAttempts).
type work func(tx *sql.Tx) (idempotency.Answer, error)

// commitOnce is the protocol both Handler and Run follow for an execution:
//
//  1. BEGIN, then read the key's row: an answer committed already is
//     replayed without doing the work (an answer committed for a different
//     request under the key is refused as idempotency.ErrKeyReused); a fence
//     above this execution's token means it is stale
//     (idempotency.ErrInProgress).
//  2. Do the work in the transaction.
//  3. Write the answer's row last (and, where the middleware keeps its
//     keys in this database, the key's answer: StoreAnswerInTx), then
//     COMMIT. When either fails, the row
//     is read again to learn what happened (see afterFailedCommit); when
//     the COMMIT went out and its reply did not come back, only once the
//     database has settled the transaction (see settleCommit).
//
// A transaction the database aborts as a serialization failure or a
// deadlock, in the work, at the row or at COMMIT, committed nothing: it
// runs again from step 1, after a pause that grows with each attempt, for
// as long as the execution lasts (or up to WithAttempts). Contention is
// not unavailability: only when the execution ends (or the attempts run
// out) is it refused as unavailable (503, the key released, so that the
// client's retry runs), with an error that says how often the database
// aborted it. again is called before each attempt after the first: the
// work's steps (idempotency.Step) are the execution's, and an attempt gets
// back those an earlier one finished (idempotency.NextAttempt).
func (s *Store) commitOnce(ctx context.Context, exec idempotency.Execution, do work, again func()) outcome {
	for attempt := 1; ; attempt++ {
		o := s.transact(ctx, exec, do)
		if o.verdict != aborted {
			return o
		}
		if attempt >= s.attempts {
			return outcome{verdict: refused, err: contended(attempt, o.err)}
		}
		if !backOff(ctx, attempt) {
			return outcome{verdict: refused, err: fmt.Errorf("%w: %w", endedBecause(ctx), contended(attempt, o.err))}
		}
		again()
	}
}

// contended is the error of a transaction the database aborted attempts
// times in a row, the last time with err.
func contended(attempts int, err error) error {
	return unavailable(fmt.Errorf("sqlidem: the database aborted the transaction %d times in a row "+
		"(serialization failures or deadlocks: contention); the last time: %w", attempts, err))
}

// transact runs the protocol once, in one transaction.
//
// The key's row is read before BEGIN, not in the transaction: a read in a
// SERIALIZABLE transaction locks what it found missing (PostgreSQL a page
// of the key's index, MySQL the gap where the key would go), and every
// other key's row written there then aborts one of the two (40001,
// deadlock), although they have nothing in common. Read outside, the row
// is what READ COMMITTED would read in the transaction; what decides is the
// row's unique key at the end (writeAnswer), at every isolation level.
func (s *Store) transact(ctx context.Context, exec idempotency.Execution, do work) outcome {
	conn, row, found, err := s.lookupOnConn(ctx, exec.Key)
	if conn != nil {
		defer conn.Close()
	}
	switch {
	case err != nil && retryable(ctx, err):
		return outcome{verdict: aborted, err: err}
	case err != nil:
		return outcome{verdict: refused, err: failed(ctx, err)}
	case found && row.Done && row.Fence == exec.Fence:
		// This very execution committed (fences are one per execution):
		// a second Run in one Do call.
		return outcome{verdict: refused, err: ErrAlreadyCommitted}
	case found && row.Done:
		return replay(exec, row)
	case found && row.Fence > exec.Fence:
		return outcome{verdict: refused, err: idempotency.ErrInProgress}
	}
	tx, err := conn.BeginTx(ctx, s.txOptions)
	if err != nil {
		return outcome{verdict: refused, err: failed(ctx, err)}
	}
	defer tx.Rollback() // after a commit, a no-op
	// done ends the transaction, if it has not ended, and gives its
	// connection back before a step that needs another: learning what
	// became of a COMMIT must not wait for a pool this execution fills.
	done := func() {
		tx.Rollback()
		conn.Close()
	}
	answer, err := do(tx)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// The work failed because the execution's context ended, not
		// of its own accord: no answer of its own to give.
		return outcome{verdict: refused, err: endedBecause(ctx)}
	case errors.Is(err, sql.ErrTxDone):
		// The work committed or rolled back tx itself, and then used it.
		done()
		return s.outcomeUnknown(ctx, exec, found, err)
	case retryable(ctx, err):
		return outcome{verdict: aborted, err: err}
	default:
		tx.Rollback() // the connection is free to be asked
		if ended(ctx, conn, err) {
			// The database ended the connection under the work: it
			// failed for want of the database, as a claim that cannot
			// reach it does (503, the key released so that the retry
			// runs), not of its own accord.
			return outcome{verdict: refused, err: unavailable(err)}
		}
		return outcome{verdict: rolledBack, err: err}
	}
	if err := s.writeAnswer(ctx, tx, exec, answer, found); err != nil {
		done()
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
			// Not ended by the context (database/sql rolls back the
			// transaction of a context that ends): by the work itself.
			return s.outcomeUnknown(ctx, exec, found, err)
		}
		// The COMMIT never went out: nothing of the transaction can commit.
		if retryable(ctx, err) {
			return outcome{verdict: aborted, err: err}
		}
		return s.afterFailedCommit(ctx, exec, err)
	}
	// Where the middleware keeps its keys in this database, the key's
	// answer commits in this transaction too.
	if err := idempotency.StoreAnswerInTx(ctx, s.db, tx, answer); err != nil {
		done()
		switch {
		case errors.Is(err, idempotency.ErrLockLost):
			return outcome{verdict: refused, err: idempotency.ErrInProgress}
		case retryable(ctx, err):
			return outcome{verdict: aborted, err: err}
		}
		return s.afterFailedCommit(ctx, exec, err)
	}
	err = tx.Commit()
	done()
	switch {
	case err == nil:
		return outcome{verdict: committed}
	case retryable(ctx, err):
		return outcome{verdict: aborted, err: err}
	case commitRefused(err):
		return s.afterFailedCommit(ctx, exec, err)
	default:
		return s.settleCommit(ctx, exec, err)
	}
}

// commitRefused reports whether a COMMIT's error is the database's own
// answer that the transaction did not commit: a constraint it checked at
// COMMIT, a transaction it had aborted already, or any SQLite error
// (SQLite is in the process: no reply can be lost). database/sql's own
// ErrTxDone says the transaction was rolled back before its COMMIT went
// out. Anything else (a broken connection, a timeout, a server going
// away) may have come after the COMMIT reached the database.
func commitRefused(err error) bool {
	if errors.Is(err, sql.ErrTxDone) {
		return true
	}
	e, ok := sqldialect.ErrorOf(err)
	if !ok {
		return false
	}
	if e.SQLite != 0 {
		return true
	}
	switch class := e.SQLState[:min(2, len(e.SQLState))]; class {
	case "23", "25", "40":
		return true
	}
	return false
}

// retryable reports whether err aborted the transaction so that running it
// again may succeed (and the execution may still run).
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && sqldialect.Retryable(err)
}

// backOff waits before attempt+1, a few milliseconds and more with each
// attempt, up to a quarter of a second, jittered so that two transactions
// that deadlocked do not meet again at once. It reports false when ctx
// ended first.
func backOff(ctx context.Context, attempt int) bool {
	d := time.Duration(min(attempt, 10)) * (5*time.Millisecond + rand.N(20*time.Millisecond))
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errFenced: the key's fence row names a newer execution than ours.
var errFenced = errors.New("sqlidem: a newer execution fenced the key")

// writeAnswer puts the answer's row in tx: a new row, or the fence row
// recovery wrote for this execution. An answer the middleware would not
// replay (a body over its WithMaxResponseBytes), or one too large for the
// database to take in one statement, commits as executed and not
// replayable: its status, without header or body. Committing it whole
// would fail every time, and every retry would run the work again.
func (s *Store) writeAnswer(ctx context.Context, tx *sql.Tx, exec idempotency.Execution, a idempotency.Answer, fenced bool) error {
	state, header, body := stateDone, []byte(nil), a.Body
	if !a.NotReplayable && len(a.Body) <= answerLimit(exec) {
		var err error
		if header, err = encodeHeader(a.Header); err != nil {
			return err
		}
	}
	if a.NotReplayable || len(a.Body) > answerLimit(exec) || !s.fits(ctx, tx, len(rowKey(exec.Key))+len(header)+len(body)) {
		state, header, body = stateExecuted, nil, nil
	}
	return s.writeRow(ctx, tx, exec, state, a.Status, header, body, fenced)
}

// writeRow writes the key's row through q: a new row, or the fence row
// recovery wrote for this execution.
func (s *Store) writeRow(ctx context.Context, q execer, exec idempotency.Execution, state string, status int, header, body []byte, fenced bool) error {
	key, now, fence := rowKey(exec.Key), time.Now().UnixMilli(), int64(exec.Fence)
	if !fenced {
		_, err := q.ExecContext(ctx, s.insertAnswer, key, exec.Fingerprint, fence, state, status, string(header), body, now)
		return err
	}
	res, err := q.ExecContext(ctx, s.updateFenced, exec.Fingerprint, fence, state, status, string(header), body, now, key, fence)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(errFenced, err)
	}
	return nil
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ErrOutcomeUnknown is the answer to an execution whose transaction was
// ended by its own work (a TxFunc, or Run's function, that called
// tx.Commit or tx.Rollback): its writes may have committed without the
// outcome row, and nothing can tell. It is never answered as "not
// executed" and the key is never released: the key's row says so in
// state 'unknown' (recovery reads it as executed, not replayable), and
// every retry gets ErrOutcomeUnknown, until an operator deletes the row
// and settles the key (idemctl). It wraps idempotency.ErrInterrupted:
// 409, problem type "interrupted".
var ErrOutcomeUnknown = fmt.Errorf("%w: sqlidem: the work ended its own transaction (tx.Commit or tx.Rollback) "+
	"before the outcome row was written; whether its writes committed is unknown", idempotency.ErrInterrupted)

// outcomeUnknown settles an execution whose work ended tx itself (cause
// is database/sql's ErrTxDone): the key's row is written 'unknown', in a
// statement of its own, so that no retry runs the work again, and the
// key is kept.
func (s *Store) outcomeUnknown(ctx context.Context, exec idempotency.Execution, fenced bool, cause error) outcome {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	err := s.writeRow(ctx, s.db, exec, stateUnknown, 0, nil, nil, fenced)
	// Written or not, the writes may have committed: say it is unknown,
	// keep the key. A row that could not be written leaves retries to
	// Redis's record of this answer.
	return outcome{verdict: unsettled, err: errors.Join(ErrOutcomeUnknown, cause, err)}
}

// afterFailedCommit learns what happened when the answer's row or the
// commit failed: the database may have committed after all (its reply
// lost), another execution may have committed first, or nothing committed.
func (s *Store) afterFailedCommit(ctx context.Context, exec idempotency.Execution, cause error) outcome {
	// The execution's context may be what ended the transaction: the
	// check runs on, for as long as a statement may take.
	execution := ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	conn, row, found, err := s.lookupOnConn(ctx, exec.Key)
	if conn != nil {
		defer conn.Close()
	}
	switch {
	case err != nil:
		return outcome{verdict: refused, err: unavailable(errors.Join(cause, err))}
	case found && row.Done && row.Fence == exec.Fence && row.Answer.Fingerprint == exec.Fingerprint:
		return outcome{verdict: committed} // ours: the commit went through
	case found && row.Done:
		return replay(exec, row)
	case found && row.Fence > exec.Fence, errors.Is(cause, errFenced):
		return outcome{verdict: refused, err: idempotency.ErrInProgress}
	}
	return outcome{verdict: refused, err: failed(execution, cause)}
}

// settleCommit learns whether a COMMIT whose reply never came landed.
// Reading the row at once cannot tell: the COMMIT may still be on its way,
// or being carried out (it landed 1.5 s after its reply was lost, in a
// reported case), and a plain read does not wait for it. So it writes the
// key's fence row under this execution's own token, as recovery does:
// the database makes that write wait for the transaction's lock on the
// row, and once it goes through the transaction is settled, either
// committed (our answer is the row; the fence write changed nothing) or
// not (the row is a fence at our token: nothing of the transaction can
// commit any more, and the client is told, truthfully, that nothing ran).
//
// Until then nothing may be said and the key must not be released: the
// attempts go on, on the execution's context, whose lease the middleware
// renews. When it ends (the execution timeout, a lost lease), the outcome
// is still unknown: the error says so (idempotency.ErrInProgress), and
// the middleware keeps the key of a run it cut off, so that the next retry
// takes it over and recovers (OutcomeStore.Recover waits for the row the
// same way).
func (s *Store) settleCommit(ctx context.Context, exec idempotency.Execution, cause error) outcome {
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		row, found, err := s.fence(ctx, exec.Key, exec.Fence)
		switch {
		case errors.Is(err, idempotency.ErrUnreadableRecord):
			return outcome{verdict: refused, err: err}
		case err != nil:
		case found && row.Done && row.Fence == exec.Fence && row.Answer.Fingerprint == exec.Fingerprint:
			return outcome{verdict: committed} // it landed
		case found && row.Done:
			return replay(exec, row)
		case found && row.Fence > exec.Fence:
			return outcome{verdict: refused, err: idempotency.ErrInProgress}
		default:
			// A fence at our token: the transaction did not commit.
			return outcome{verdict: refused, err: unavailable(cause)}
		}
		timer := time.NewTimer(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return outcome{verdict: unsettled, err: fmt.Errorf("%w: sqlidem: the reply to COMMIT was lost, "+
				"and whether it landed could not be learned before the execution ended: %w",
				idempotency.ErrInProgress, errors.Join(cause, err, context.Cause(ctx)))}
		}
	}
}

// checkTimeout bounds the read that learns what a failed commit did.
const checkTimeout = 5 * time.Second

// endedBecause says why an execution's context ended: the lease was lost (the
// key belongs to another execution now, or will once a retry takes it
// over: ErrInProgress, to be retried), or its time ran out.
func endedBecause(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, idempotency.ErrLockLost) {
		return fmt.Errorf("%w: %w", idempotency.ErrInProgress, cause)
	}
	return unavailable(cause)
}

// replay answers with a committed answer, if it is this request's.
func replay(exec idempotency.Execution, row Row) outcome {
	switch {
	case row.Answer.Fingerprint != exec.Fingerprint:
		return outcome{verdict: refused, err: idempotency.ErrKeyReused}
	case row.Unknown:
		return outcome{verdict: unsettled, err: ErrOutcomeUnknown}
	}
	return outcome{verdict: replayed, answer: row.Answer}
}

// failed is the error of a database step that failed: a committed answer
// that cannot be read as such, else why the execution's context ended, if
// it did, or else the database's failure.
func failed(ctx context.Context, err error) error {
	if errors.Is(err, idempotency.ErrUnreadableRecord) {
		return err
	}
	if ctx.Err() != nil {
		return endedBecause(ctx)
	}
	return unavailable(err)
}

// commitFailed is the error of an unprotected transaction whose COMMIT
// failed: the work's own commit or rollback (ErrTxDone) leaves its
// outcome unknown; anything else is the database's failure.
func commitFailed(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return errors.Join(ErrOutcomeUnknown, err)
	}
	return unavailable(err)
}

// unavailable wraps a database failure so that errors.Is finds both
// idempotency.ErrStoreUnavailable (a 503 that says nothing ran) and the
// cause.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", idempotency.ErrStoreUnavailable, err)
}
