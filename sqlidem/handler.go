package sqlidem

import (
	"bytes"
	"database/sql"
	"io"
	"net/http"

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
//     client never sees an answer whose writes did not commit: up to the
//     middleware's WithMaxResponseBytes in memory, the rest in a temporary
//     file. An answer over that limit (or over MySQL's max_allowed_packet)
//     still reaches its client whole, and commits as executed and not
//     replayable: duplicates get idempotency.ErrNotReplayable.
//  3. The answer's row goes in last. When another execution of the key
//     committed first (after a takeover, or after Redis forgot the key),
//     the row cannot go in: everything fn wrote rolls back, and the other
//     execution's answer is replayed. When recovery has fenced the key for
//     a newer execution, the row cannot go in either: this execution is
//     stale, and is answered idempotency.ErrInProgress.
//
// When fn returns an error, nothing commits and the key is released
// (idempotency.Release), so a retry runs again: the answer fn wrote is
// sent unstored when it is a refusal (a 422 for a request that a
// corrected retry may fix); otherwise, and for an answer below 400, which
// would tell of writes that rolled back, the error handler answers (see
// WithErrorHandler). A failure of the database is answered
// idempotency.ErrStoreUnavailable, fn's error too when the database ended
// the connection under fn (fn failed for want of the database, not of
// its own accord), and a run whose lease was lost
// idempotency.ErrInProgress, the key released, unless the commit turns
// out to have happened. A COMMIT whose reply was lost is settled first:
// the answer is the committed one, or ErrStoreUnavailable once nothing
// can commit any more; unsettled when the execution ends, it is
// idempotency.ErrInProgress with the key kept, for the next retry to
// recover. Inside fn,
// return an error rather than call idempotency.Release: a committed answer
// is the key's answer for as long as its row lives, whatever Redis keeps.
//
// A transaction the database aborts as a serialization failure or a
// deadlock committed nothing and runs again, fn included, with the
// request's body from its start and an empty answer (see WithAttempts).
// A step (idempotency.Step) that an earlier attempt finished took effect:
// the attempt that runs again gets its result back without running it
// (idempotency.NextAttempt).
//
// fn must leave tx's end to Handler: a fn that calls tx.Commit or
// tx.Rollback itself ended the transaction before the outcome row could
// go in, and whether its writes committed is unknown; the request and
// every retry are answered ErrOutcomeUnknown, the key kept, and fn never
// runs again for the key.
//
// fn must do all its writes in tx: the database's answer about the outcome
// row is what makes a second execution's writes roll back. Calls to other
// systems are not covered by the transaction: make each an idempotency.Step
// and pass it its idempotency.StepKey, so that a rerun's call deduplicates
// (and, with idempotency.WithResume, is not made again at all).
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
		var buf *buffer
		defer func() { buf.close() }()
		rewind := rewinder(r)
		attempt := r
		o := s.commitOnce(r.Context(), exec, func(tx *sql.Tx) (idempotency.Answer, error) {
			// Each attempt answers afresh, from the request's first byte.
			buf.close()
			buf = newBuffer(answerLimit(exec))
			if err := rewind(); err != nil {
				return idempotency.Answer{}, err
			}
			if err := fn(tx, buf, attempt); err != nil {
				return idempotency.Answer{}, err
			}
			return buf.answer(), nil
		}, func() {
			// A step an attempt finished took effect: the next gets its
			// result back rather than run it again.
			attempt = r.WithContext(idempotency.NextAttempt(r.Context()))
		})
		switch o.verdict {
		case committed:
			buf.writeTo(w)
		case replayed:
			if o.answer.NotReplayable {
				// It ran; its answer was too large to keep. Not
				// released: the key's work is done.
				s.fail(w, r, idempotency.ErrNotReplayable)
				return
			}
			// Through the middleware's own replay: its header rules, its
			// hook and its marker, as for an answer replayed from Redis.
			idempotency.WriteReplay(w, r, o.answer)
		case rolledBack:
			s.rolledBack(w, r, buf, o.err)
		case unsettled:
			// Not released: the commit may yet land (see settleCommit).
			s.fail(w, r, o.err)
		default:
			s.refuse(w, r, o.err)
		}
	})
}

// rewinder returns a function that puts r's body back at its start, for
// an attempt after the first: fn reads it again. The middleware has read
// the body in full already (to fingerprint it) and hands it on seekable;
// any other body is read into memory once.
func rewinder(r *http.Request) func() error {
	if r.Body == nil || r.Body == http.NoBody {
		return func() error { return nil }
	}
	seeker, ok := r.Body.(io.Seeker)
	if !ok {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return func() error { return err }
		}
		rd := bytes.NewReader(body)
		r.Body, seeker = io.NopCloser(rd), rd
	}
	body, first := r.Body, true
	return func() error {
		if first {
			first = false
			return nil
		}
		r.Body = body // fn may have wrapped it (http.MaxBytesReader)
		_, err := seeker.Seek(0, io.SeekStart)
		return err
	}
}

// answerLimit is the most body an execution's answer may commit for
// replay: the middleware's WithMaxResponseBytes.
func answerLimit(exec idempotency.Execution) int {
	if exec.MaxResponseBytes > 0 {
		return exec.MaxResponseBytes
	}
	return 1 << 20 // the middleware's default
}

// rolledBack answers for a TxFunc that returned err: nothing committed.
// The answer fn wrote is sent only when it is a refusal (4xx, 5xx), which
// tells the client why; a success (or a redirect, which says where the
// created thing lives) would claim writes that rolled back, so the error
// handler answers instead.
func (s *Store) rolledBack(w http.ResponseWriter, r *http.Request, buf *buffer, err error) {
	idempotency.Release(r.Context())
	if buf.status >= http.StatusBadRequest {
		if buf.status >= http.StatusInternalServerError {
			idempotency.ReportError(r.Context(), err) // the handler's own failure, not the client's
		}
		buf.writeTo(w)
		return
	}
	s.fail(w, r, err)
}

// fail answers err with the error handler, and reports it to the
// middleware first (idempotency.ReportError), whatever the handler: the
// middleware logs it once, and its observer sees it.
func (s *Store) fail(w http.ResponseWriter, r *http.Request, err error) {
	err = idempotency.ClientError(r.Context(), err) // no "not executed" once a step took effect
	idempotency.ReportError(r.Context(), err)
	s.onError(w, r, err)
}

// refuse releases the key, so that a retry may run, and answers err.
func (s *Store) refuse(w http.ResponseWriter, r *http.Request, err error) {
	idempotency.Release(r.Context())
	s.fail(w, r, err)
}

// serveUnprotected runs fn in a transaction of its own.
func (s *Store) serveUnprotected(w http.ResponseWriter, r *http.Request, fn TxFunc) {
	var tx *sql.Tx
	conn, err := s.connect(r.Context(), func(conn *sql.Conn) (err error) {
		tx, err = conn.BeginTx(r.Context(), nil)
		return err
	})
	if err != nil {
		s.fail(w, r, unavailable(err))
		return
	}
	defer conn.Close()
	defer tx.Rollback()
	buf := newBuffer(1 << 20) // nothing is committed; past this it waits on disk
	defer buf.close()
	if err := fn(tx, buf, r); err != nil {
		tx.Rollback()
		if ended(r.Context(), conn, err) {
			s.fail(w, r, unavailable(err))
			return
		}
		s.rolledBack(w, r, buf, err)
		return
	}
	if err := tx.Commit(); err != nil {
		s.fail(w, r, commitFailed(err))
		return
	}
	buf.writeTo(w)
}
