package idempotency

import (
	"context"
	"database/sql"
)

// StoreAnswerInTx stores a as the answer of the protected handler that
// ctx belongs to, in tx, when the handler's Middleware keeps its keys in
// db (NewSQL on the same database): the key's answer then commits with
// the handler's writes in tx, or not at all, and a retry that comes
// after the COMMIT replays it at once, whatever becomes of the process.
// The Middleware still answers the request, and lets the key's lease go,
// when the handler returns.
//
// It writes nothing and returns nil where the keys live elsewhere (Redis,
// another database), for a function that Do runs, and outside a protected
// handler: the Middleware stores the answer after the handler, as always.
// It returns ErrLockLost when another executor owns the key now (it was
// taken over, or settled by an operator): tx must not commit. Package
// sqlidem calls it with the answer it commits; a handler that commits
// its own transaction may call it last before COMMIT.
func StoreAnswerInTx(ctx context.Context, db *sql.DB, tx *sql.Tx, a Answer) error {
	x, ok := ctx.Value(executionKey).(*execution)
	if !ok || x.owner == nil || x.lease == nil {
		return nil
	}
	l := x.lease
	s, ok := l.m.keyStore.(*sqlStore)
	if !ok || s.db != db {
		return nil
	}
	rec := l.m.recordOf(a)
	if a.NotReplayable || len(a.Body) > l.m.cfg.maxResponse {
		rec = nil // executed, not replayable, as the Middleware would store it
	}
	text, err := s.storeInTx(ctx, tx, l.k, l.lockValue, l.fpText, l.fence, rec, l.k.lifetime(l.m.cfg.recordTTL).Microseconds())
	if err != nil {
		return err
	}
	l.committed.Store(&text)
	return nil
}

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
	texts := newCompletionTexts(fp, lockValue, fence, rec)
	if s.maxStatement > 0 && rec != nil && 2*len(texts.buf)+statementRoom > s.maxStatement {
		texts = newCompletionTexts(fp, lockValue, fence, nil) // as complete does
	}
	stored, claimed := string(texts.buf[texts.claimed:]), string(texts.buf[:texts.claimed])
	n, err := rowsAffected(tx.ExecContext(ctx, s.q.storeHeld, []byte(stored), life, k.record, []byte(claimed)))
	switch {
	case err != nil:
		return "", err
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

// completeCommitted lets the lease of a run whose answer committed in the
// handler's transaction (StoreAnswerInTx) go, with the record's life the
// policy chose: one UPDATE over the record as the transaction wrote it.
// It reports false when that record is not there (the transaction rolled
// back, or the statement failed): complete then decides.
func (l *lease) completeCommitted(ctx context.Context, ttl int64) bool {
	text := l.committed.Load()
	s, ok := l.m.keyStore.(*sqlStore)
	if text == nil || !ok {
		return false
	}
	n, err := s.changeRow(ctx, s.q.store, []byte(*text), ttl, l.lockValue, l.lockValue, l.k.record, []byte(*text))
	return err == nil && n == 1
}
