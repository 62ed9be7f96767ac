package sqlidem

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/onceonly/idempotency"
)

// A TxFunc does a protected handler's work in tx and writes its answer to
// w. Returning nil commits the writes and the answer together; returning
// an error rolls both back.
type TxFunc func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error

// Handler returns a handler, to be protected by an idempotency middleware,
// that runs fn in a transaction and commits fn's answer in the same
// transaction, in a row keyed by the request's idempotency key:
//
//  1. If the key's answer is committed already (the instance that ran it
//     stopped before Redis stored it, or Redis lost it), fn does not run:
//     the committed answer is replayed, with the Idempotent-Replayed
//     header. An answer committed for a different request under the same
//     key is refused as idempotency.ErrKeyReused.
//  2. Otherwise fn runs. Its answer is held back until the commit, so a
//     client never sees an answer whose writes did not commit.
//  3. The answer's row goes in last. When another execution of the key
//     committed first (after a takeover, or after Redis forgot the key),
//     the row cannot go in: everything fn wrote rolls back, and the other
//     execution's answer is replayed. When recovery has fenced the key for
//     a newer execution, the row cannot go in either: this execution is
//     stale, and is answered idempotency.ErrInProgress.
//
// When fn returns an error, nothing commits and the key is released
// (idempotency.Release), so a retry runs again: the answer fn wrote, if
// any, is sent unstored (a 422 for a request that a corrected retry may
// fix); otherwise the error handler answers (see WithErrorHandler). A
// failure to commit is answered idempotency.ErrStoreUnavailable, the key
// released, unless the commit turns out to have happened.
//
// fn must do all its writes in tx: the database's answer about the outcome
// row is what makes a second execution's writes roll back. Calls to other
// systems are not covered; pass them the request's key (see
// idempotency.Execution) so that they deduplicate too.
//
// Outside a protected execution (a route the middleware lets through
// unprotected), fn runs in a transaction with no outcome row.
func (s *Store) Handler(fn TxFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		exec, protected := idempotency.ExecutionOf(r.Context())
		if !protected {
			s.serveUnprotected(w, r, fn)
			return
		}
		s.serve(w, r, exec, fn)
	})
}

func (s *Store) serve(w http.ResponseWriter, r *http.Request, exec idempotency.Execution, fn TxFunc) {
	ctx := r.Context()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		s.refuse(w, r, unavailable(err))
		return
	}
	defer tx.Rollback() // after a commit, a no-op
	row, found, err := s.lookup(ctx, tx, exec.Key)
	switch {
	case err != nil:
		s.refuse(w, r, unavailable(err))
		return
	case found && row.Done:
		tx.Rollback()
		s.replay(w, r, exec, row.Answer)
		return
	case found && row.Fence > exec.Fence:
		s.refuse(w, r, idempotency.ErrInProgress)
		return
	}
	buf := newBuffer()
	if err := fn(tx, buf, r); err != nil {
		tx.Rollback()
		s.rolledBack(w, r, buf, err)
		return
	}
	err = s.writeOutcome(ctx, tx, exec, buf, found)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		tx.Rollback()
		s.afterFailedCommit(w, r, exec, buf, err)
		return
	}
	buf.writeTo(w)
}

// errFenced: the key's fence row names a newer execution than ours.
var errFenced = errors.New("sqlidem: a newer execution fenced the key")

// writeOutcome puts the answer's row in tx: a new row, or the fence row
// recovery wrote for this execution.
func (s *Store) writeOutcome(ctx context.Context, tx *sql.Tx, exec idempotency.Execution, buf *buffer, fenced bool) error {
	header, err := json.Marshal(buf.stored())
	if err != nil {
		return err
	}
	now, fence := time.Now().UnixMilli(), int64(exec.Fence)
	if !fenced {
		_, err := tx.ExecContext(ctx, s.insertDone, exec.Key, exec.Fingerprint, fence, buf.code(), string(header), buf.body.Bytes(), now)
		return err
	}
	res, err := tx.ExecContext(ctx, s.updateFenced, exec.Fingerprint, fence, buf.code(), string(header), buf.body.Bytes(), now, exec.Key, fence)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(errFenced, err)
	}
	return nil
}

// afterFailedCommit answers when the outcome row or the commit failed: the
// database may have committed after all (its reply lost), another
// execution may have committed first, or nothing committed.
func (s *Store) afterFailedCommit(w http.ResponseWriter, r *http.Request, exec idempotency.Execution, buf *buffer, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	row, found, err := s.lookup(ctx, s.db, exec.Key)
	switch {
	case err != nil:
		s.refuse(w, r, unavailable(errors.Join(cause, err)))
	case found && row.Done && row.Fence == exec.Fence && row.Answer.Fingerprint == exec.Fingerprint:
		buf.writeTo(w) // ours: the commit went through
	case found && row.Done:
		s.replay(w, r, exec, row.Answer)
	case found && row.Fence > exec.Fence, errors.Is(cause, errFenced):
		s.refuse(w, r, idempotency.ErrInProgress)
	default:
		s.refuse(w, r, unavailable(cause))
	}
}

// replay answers with a committed answer, if it is this request's.
func (s *Store) replay(w http.ResponseWriter, r *http.Request, exec idempotency.Execution, a idempotency.Answer) {
	if a.Fingerprint != exec.Fingerprint {
		s.refuse(w, r, idempotency.ErrKeyReused)
		return
	}
	h := w.Header()
	for name, values := range a.Header {
		h[name] = append([]string(nil), values...)
	}
	h.Set(idempotency.ReplayedHeader, "true")
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// rolledBack answers for a TxFunc that returned err.
func (s *Store) rolledBack(w http.ResponseWriter, r *http.Request, buf *buffer, err error) {
	idempotency.Release(r.Context())
	if buf.status != 0 || buf.body.Len() > 0 {
		buf.writeTo(w)
		return
	}
	s.onError(w, r, err)
}

// refuse releases the key, so that a retry may run, and answers err.
func (s *Store) refuse(w http.ResponseWriter, r *http.Request, err error) {
	idempotency.Release(r.Context())
	s.onError(w, r, err)
}

// serveUnprotected runs fn in a transaction of its own.
func (s *Store) serveUnprotected(w http.ResponseWriter, r *http.Request, fn TxFunc) {
	tx, err := s.db.BeginTx(r.Context(), nil)
	if err != nil {
		s.onError(w, r, unavailable(err))
		return
	}
	defer tx.Rollback()
	buf := newBuffer()
	if err := fn(tx, buf, r); err != nil {
		tx.Rollback()
		s.rolledBack(w, r, buf, err)
		return
	}
	if err := tx.Commit(); err != nil {
		s.onError(w, r, unavailable(err))
		return
	}
	buf.writeTo(w)
}

// unavailable wraps a database failure so that errors.Is finds both
// idempotency.ErrStoreUnavailable (a 503 that says nothing ran) and the
// cause.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", idempotency.ErrStoreUnavailable, err)
}
