package idempotency

import (
	"context"
	"database/sql"
	"errors"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/sqldialect"
)

// StoreAnswerInTx stores a as the answer of the protected handler, or of
// the function Do runs, that ctx belongs to, in tx, when its Middleware
// keeps its keys in db (NewSQL on the same database): the key's answer
// then commits with the work's writes in tx, or not at all: whatever
// becomes of the process after the COMMIT, the key is answered, with no
// takeover and no recovery. The Middleware still answers the request when
// the handler returns, and then stores what it sent (what layers between
// it and the handler added included) over that answer as it lets the
// lease go (Do: the function's result); duplicates wait for that. After a
// crash, once the lease lapsed, the key replays a, as it replays an answer
// recovered from an OutcomeStore. For Do, a is the result as sqlidem.Run
// commits it: status 200 and the body Do's codec encodes.
//
// It writes nothing and returns nil where the keys live elsewhere (Redis,
// another database), outside a protected handler or a function of Do,
// and where the key's row cannot be written in tx without
// aborting it: on PostgreSQL above READ COMMITTED (the lease's renewals
// change the row after tx's snapshot), and after tx was aborted once on
// the row (a retryable error: the caller's next attempt stores nothing
// in it). The Middleware stores the answer after the handler, as always.
// It returns ErrLockLost when another executor owns the key now (it was
// taken over, or settled by an operator): tx must not commit. Package
// sqlidem calls it with the answer it commits; a handler that commits
// its own transaction may call it last before COMMIT.
func StoreAnswerInTx(ctx context.Context, db *sql.DB, tx *sql.Tx, a Answer) error {
	x, ok := ctx.Value(executionKey).(*execution)
	if !ok || x.lease == nil || x.owner == nil && x.codec == nil { // neither a handler nor Do's function
		return nil
	}
	l := x.lease
	s, ok := l.m.keyStore.(*sqlStore)
	if !ok || s.db != db || l.inTxConflicts.Load() {
		return nil
	}
	rec := l.m.recordOf(a) // for Do, a (status statusResult, the encoded result) is its own record
	if a.NotReplayable || len(a.Body) > l.m.cfg.maxResponse {
		rec = nil // executed, not replayable, as the Middleware would store it
	}
	text, err := s.storeInTx(ctx, tx, l.k, l.lockValue, l.fpText, l.fence, rec, l.k.lifetime(l.m.cfg.recordTTL).Microseconds())
	switch {
	case errors.Is(err, errNotInTx):
		return nil
	case sqldialect.Retryable(err):
		l.inTxConflicts.Store(true) // the next attempt stores after its commit
		return err
	case err != nil:
		return err
	}
	l.committed.Store(&text)
	return nil
}

// errNotInTx: the key's row cannot be written in the caller's transaction
// without aborting it.
var errNotInTx = errors.New("idempotency: not in this transaction")

// storeInTx is complete in the caller's transaction, with the lease kept:
// the run still holds its key until the Middleware lets it go, and a
// watchdog that found its lease gone would cut a run that has committed.
// Over the claim as it was written that is one UPDATE; otherwise (a run
// that journaled steps, or a takeover) keyRow.complete decides, on the
// row read under the transaction's lock. It returns the record written.
func (s *sqlStore) storeInTx(ctx context.Context, tx *sql.Tx, k keys, lockValue, fp string, fence uint64, rec *record, life int64) (string, error) {
	if err := s.ensureTable(ctx); err != nil {
		return "", err
	}
	texts := s.completionTexts(k, fp, lockValue, fence, rec)
	stored, claimed := string(texts.buf[texts.claimed:]), string(texts.buf[:texts.claimed])
	here, n := true, int64(0)
	var err error
	if s.dialect == PostgreSQL {
		err = tx.QueryRowContext(ctx, s.q.storeHeld, []byte(stored), life, k.record, []byte(claimed)).Scan(&here, &n)
	} else {
		n, err = rowsAffected(tx.ExecContext(ctx, s.q.storeHeld, []byte(stored), life, k.record, []byte(claimed)))
	}
	switch {
	case err != nil:
		return "", err
	case !here:
		return "", errNotInTx
	case n == 1:
		return stored, nil
	}
	if _, err := tx.ExecContext(ctx, s.q.insert, k.record); err != nil { // the record vanished: its row too
		return "", err
	}
	var r keyRow
	if err := s.scanRow(tx.QueryRowContext(ctx, s.q.lock, k.record), &r); err != nil {
		return "", err
	}
	holder, holderUntil := r.holder, r.holderUntil
	if r.complete(lockValue, stored, claimed, life) == 0 {
		return "", ErrLockLost
	}
	r.holder, r.holderUntil = holder, holderUntil // the lease stays
	if _, err := tx.ExecContext(ctx, s.q.update, []byte(r.record), r.recordUntil, r.holder, r.holderUntil, k.record); err != nil {
		return "", err
	}
	return r.record, nil
}

// completeCommitted stores rec, the answer the Middleware sent, over the
// one the handler's transaction committed (StoreAnswerInTx), with the
// record's life the policy chose, and lets the lease go: one UPDATE over
// the record as the transaction wrote it. It reports false when that
// record is not there (the transaction rolled back, or the statement
// failed): complete then decides.
func (l *lease) completeCommitted(ctx context.Context, rec *record, life int64) bool {
	text := l.committed.Load()
	s, ok := l.m.keyStore.(*sqlStore)
	if text == nil || !ok {
		return false
	}
	texts := s.completionTexts(l.k, l.fpText, l.lockValue, l.fence, rec)
	stored := string(texts.buf[texts.claimed:])
	// The committed record's line stays, with what was sent, as
	// keyRow.complete keeps the line of a run it completes.
	if line, ok := keyspace.ParseRecord(*text); ok {
		stored = completedText(line, stored)
	}
	var n int64
	err := s.asHolder(ctx, func(c sqlConn) (err error) {
		n, err = s.changeRow(ctx, c, s.q.store, []byte(stored), life, l.lockValue, l.lockValue, l.k.record, []byte(*text))
		return err
	})
	return err == nil && n == 1
}
