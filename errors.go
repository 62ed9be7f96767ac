package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Sentinel errors passed to the error handler. Match them with errors.Is: an
// error from a failing Redis call wraps ErrStoreUnavailable together with the
// cause, for logging; the default handler never shows the cause to clients.
var (
	ErrMissingKey       = errors.New("idempotency: missing idempotency key")
	ErrInvalidKey       = errors.New("idempotency: malformed idempotency key")
	ErrUnreadableBody   = errors.New("idempotency: request body could not be read")
	ErrRequestTooLarge  = errors.New("idempotency: request body too large")
	ErrNoScope          = errors.New("idempotency: caller has no scope")
	ErrTokenNotFound    = errors.New("idempotency: token not found")
	ErrTokenExpired     = errors.New("idempotency: token expired")
	ErrKeyReused        = errors.New("idempotency: key reused for a different request")
	ErrInProgress       = errors.New("idempotency: original request still in progress")
	ErrNotReplayable    = errors.New("idempotency: original response cannot be replayed")
	ErrNotAcceptable    = errors.New("idempotency: stored response does not match this request's negotiation")
	ErrInterrupted      = errors.New("idempotency: original execution was interrupted")
	ErrUnreadableRecord = errors.New("idempotency: stored response cannot be read")
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
	// ErrLockLost is the cause of a run's context when the lease was lost
	// while another executor could take the key over (see context.Cause),
	// what Do returns with the function's error then, what Step returns
	// once the run's key is another execution's, and what is logged when a
	// handler's answer could not be stored because another execution owns
	// the key now. WriteError and ClientError answer it as ErrInProgress
	// (409, Retry-After): the retry gets the other execution's answer.
	ErrLockLost = errors.New("idempotency: lock lost before the response was stored")
	// ErrExecutionTimeout is the cause of a run's context when
	// WithExecutionTimeout ends it, and what Do returns with the function's
	// error then; it matches context.DeadlineExceeded too. Never answered
	// to a client.
	ErrExecutionTimeout = fmt.Errorf("idempotency: execution timeout: %w", context.DeadlineExceeded)
)

// ErrHandlerPanicked is the Event.Err of an execution whose handler panicked.
var ErrHandlerPanicked = errors.New("idempotency: handler panicked")

// ProblemTypeBase is the prefix of every problem type URI this package
// answers with. The URIs are stable; the README documents each one.
const ProblemTypeBase = "https://github.com/onceonly/idempotency/blob/main/README.md#problem-"

// A problem is one row of the HTTP contract's error table, rendered once.
type problem struct {
	err        error
	status     int
	slug       string
	title      string
	detail     string
	retryAfter bool
	body       []byte      // application/problem+json
	html       problemPage // for a browser (problempage.go)
}

var problems = []*problem{
	{err: ErrMissingKey, status: http.StatusBadRequest, slug: "missing-key",
		title: "Idempotency key missing", detail: "This endpoint requires an idempotency key or token."},
	{err: ErrInvalidKey, status: http.StatusBadRequest, slug: "invalid-key",
		title: "Idempotency key malformed", detail: "The idempotency key must be printable ASCII and not too long."},
	{err: ErrUnreadableBody, status: http.StatusBadRequest, slug: "unreadable-body",
		title: "Request body unreadable", detail: "The request body could not be read in full."},
	{err: ErrRequestTooLarge, status: http.StatusRequestEntityTooLarge, slug: "request-too-large",
		title: "Request body too large", detail: "The request body exceeds the limit of this endpoint."},
	{err: ErrNoScope, status: http.StatusUnauthorized, slug: "no-scope",
		title: "Caller not identified", detail: "The request does not identify the caller the key belongs to."},
	{err: ErrTokenNotFound, status: http.StatusUnprocessableEntity, slug: "token-not-found",
		title: "Idempotency token not found", detail: "The token is unknown, or was issued to another session."},
	{err: ErrTokenExpired, status: http.StatusUnprocessableEntity, slug: "token-expired",
		title: "Idempotency token expired", detail: "The token expired before it was used; nothing was done. Take a new token and submit again."},
	{err: ErrKeyReused, status: http.StatusUnprocessableEntity, slug: "key-reused",
		title: "Idempotency key reused", detail: "The key was already used for a request with a different method, path, body or caller."},
	{err: ErrInProgress, status: http.StatusConflict, slug: "in-progress", retryAfter: true,
		title: "Original request in progress", detail: "A request with this key is still being processed; retry later."},
	{err: ErrNotReplayable, status: http.StatusConflict, slug: "not-replayable",
		title: "Response not replayable", detail: "The request was executed, but its response was streamed or too large to store."},
	{err: ErrNotAcceptable, status: http.StatusNotAcceptable, slug: "not-acceptable",
		title: "Stored response not acceptable", detail: "The request was executed, but its stored response was made for a request with different content negotiation (Accept-Encoding, or a header its Vary names); retry as the original request did."},
	{err: ErrInterrupted, status: http.StatusConflict, slug: "interrupted",
		title: "Original execution interrupted", detail: "The request was claimed by a server that stopped before storing a response; its outcome is unknown. An operator settles the key with idemctl."},
	{err: ErrUnreadableRecord, status: http.StatusConflict, slug: "unreadable-record",
		title: "Stored response unreadable", detail: "The request was executed, but its stored response cannot be read; it cannot be replayed, and retrying will not change that."},
	{err: ErrStoreUnavailable, status: http.StatusServiceUnavailable, slug: "store-unavailable", retryAfter: true,
		title: "Idempotency store unavailable", detail: "The request was not executed; retry later."},
}

var internalProblem = &problem{status: http.StatusInternalServerError, slug: "internal",
	title: "Internal error", detail: "The request could not be processed."}

func init() {
	for _, p := range append(problems, internalProblem) {
		p.body = []byte(`{"type":"` + ProblemTypeBase + p.slug + `","title":"` + p.title +
			`","status":` + strconv.Itoa(p.status) + `,"detail":"` + p.detail + `"}`)
		p.html = newProblemPage(p)
	}
}

func problemFor(err error) *problem {
	for _, p := range problems {
		if errors.Is(err, p.err) {
			return p
		}
	}
	return internalProblem
}

// retryAfter is an error that says when a retry may succeed.
type retryAfter struct {
	error
	after time.Duration
}

func (e retryAfter) Unwrap() error { return e.error }

// RetryAfter reports how long a client should wait before it retries the
// request that err answered: for ErrInProgress the lock lease while the
// key's owner holds it (the pace at which to ask again), or the time left
// until the claim horizon once its lock lapsed (a crashed owner's key reads
// in progress until then, and interrupted after), for ErrStoreUnavailable
// one second, and 0 for errors that a retry cannot fix. DefaultErrorHandler
// sends it as Retry-After; a custom error handler may do the same.
func RetryAfter(err error) time.Duration {
	var ra retryAfter
	if errors.As(err, &ra) {
		return ra.after
	}
	if problemFor(err).retryAfter {
		return time.Second
	}
	return 0
}

// retryAfterSeconds is after in whole seconds, rounded up, as Retry-After
// says it.
func retryAfterSeconds(after time.Duration) string {
	return strconv.FormatInt(int64((after+time.Second-1)/time.Second), 10)
}

// inProgress is ErrInProgress, to be retried after a lease.
func (m *Middleware) inProgress() error {
	return retryAfter{ErrInProgress, m.cfg.lease}
}

// inProgressAsHeard is ErrInProgress, to be retried when the key's answer
// can next change, as c last heard from Redis or, when c followed a
// flight (fl), its leader did: at least a lease.
func (m *Middleware) inProgressAsHeard(c *call, fl *flight) error {
	after := max(m.cfg.lease, time.Until(c.changesAt))
	if fl != nil {
		after = max(after, fl.retryIn(m.cfg.lease))
	}
	return retryAfter{ErrInProgress, after}
}

// DefaultErrorHandler answers err as an RFC 9457 application/problem+json
// body with a stable type URI per sentinel error. The body is fixed per error
// and never contains err's text, so a Redis failure leaks nothing. A request
// that prefers HTML (a browser's navigation: its Accept names text/html
// before any JSON type) gets a page of the same title and detail instead,
// under the same status and headers, with the time to wait spelled out.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Add("Vary", "Accept")
	after := RetryAfter(err)
	if after > 0 {
		h.Set("Retry-After", retryAfterSeconds(after))
	}
	if prefersHTML(r) {
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(p.status)
		w.Write(p.page(after))
		return
	}
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.status)
	w.Write(p.body)
}

// WriteError answers err as the middleware protecting r's route does (its
// WithErrorHandler, DefaultErrorHandler by default), so that code behind
// the middleware, such as an outcome store, refuses a request in the same
// form as the middleware's own refusals. It reports err first
// (ReportError). Outside a protected execution it is DefaultErrorHandler.
//
// Once a step of the execution took effect, an error that would tell the
// client that nothing was executed (ErrStoreUnavailable) is answered as
// ErrInProgress: the run is kept, and a retry with the same key gets its
// resumed answer, while a client told "not executed" would start over with
// a new key and repeat the step's effect.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	if e, ok := r.Context().Value(executionKey).(*execution); ok {
		err = e.truthful(err)
		ReportError(r.Context(), err)
		if e.onError != nil {
			e.onError(w, r, err)
			return
		}
	}
	DefaultErrorHandler(w, r, err)
}

// ReportError tells the middleware why the protected handler running on
// ctx failed, as code behind the middleware (an outcome store, a handler
// that answers an error of its own) knows best: err is the Event.Err the
// observer gets for the request, and, unless the failure is the client's
// (a reused key, a malformed request) or no failure at all (an answer too
// large to replay), it is logged through the middleware's logger
// (WithLogger), with its text: at error level for a problem answered 5xx
// (a database that failed, an error of the handler's own) or one whose
// outcome is unknown (ErrInterrupted, ErrUnreadableRecord), at warning
// level for ErrInProgress (a lost lease, a newer execution). Only the
// first report of an execution counts: a failure is logged once. Outside
// a protected handler it does nothing; a function run by Do returns its
// error instead.
func ReportError(ctx context.Context, err error) {
	x, ok := ctx.Value(executionKey).(*execution)
	if !ok || err == nil || x.owner == nil || !x.failure.CompareAndSwap(nil, &err) {
		return
	}
	log, status := x.owner.cfg.logger, problemFor(err).status
	switch {
	case status >= 500, errors.Is(err, ErrInterrupted), errors.Is(err, ErrUnreadableRecord):
		log.Error("idempotency: the protected handler failed", "key", x.key, "status", status, "error", err)
	case errors.Is(err, ErrInProgress):
		log.Warn("idempotency: the protected handler could not finish", "key", x.key, "status", status, "error", err)
	}
}

// reported is the failure the work of x reported, or nil.
func (x *execution) reported() error {
	if err := x.failure.Load(); err != nil {
		return *err
	}
	return nil
}

// ClientError is err as the client of the protected execution on ctx may
// be told it, for an error handler of one's own (sqlidem's
// WithErrorHandler): once a step of the execution took effect, an error
// that says nothing was executed (ErrStoreUnavailable) becomes one that
// wraps ErrInProgress, and the run is kept for a retry to resume, as
// WriteError does. Any other error, and any error outside a protected
// execution, is returned as it is.
func ClientError(ctx context.Context, err error) error {
	if x, ok := ctx.Value(executionKey).(*execution); ok {
		return x.truthful(err)
	}
	return err
}

// truthful is err as it may be told about the execution x: an error that
// says nothing was executed (ErrStoreUnavailable), once a step of x took
// effect, says the run is in progress instead; and the answer that says so
// is not the key's (it would be replayed for good), so x is marked as a
// Release marks it, which keeps a run whose steps took effect.
func (x *execution) truthful(err error) error {
	if err != nil && errors.Is(err, ErrLockLost) && !errors.Is(err, ErrInProgress) {
		// Another execution owns the key now (a takeover after this one's
		// lease ran out): a retry gets its answer. Said as in-progress, not
		// as an internal error, and never stored as the key's answer.
		x.state.CompareAndSwap(execRunning, execReleased)
		return errOwnedElsewhere{err}
	}
	if err == nil || !errors.Is(err, ErrStoreUnavailable) || errors.Is(err, ErrInProgress) || !x.tookEffect() {
		return err
	}
	x.state.CompareAndSwap(execRunning, execReleased)
	return errStepsTookEffect{err}
}

// errOwnedElsewhere is ErrLockLost as a client may be told it: the key is
// another execution's now, in progress or answered, and a retry gets that
// answer.
type errOwnedElsewhere struct{ cause error }

func (e errOwnedElsewhere) Error() string {
	return "idempotency: another execution owns the key now; a retry gets its answer: " + e.cause.Error()
}

func (e errOwnedElsewhere) Unwrap() []error { return []error{ErrInProgress, e.cause} }

// errStepsTookEffect is an error of a run whose steps took effect: it is
// ErrInProgress (a retry resumes the run), and says what happened, but no
// longer matches ErrStoreUnavailable, whose answer says nothing ran.
type errStepsTookEffect struct{ cause error }

func (e errStepsTookEffect) Error() string {
	return "idempotency: a step of the run took effect, and the run is kept for a retry to resume: " + e.cause.Error()
}

func (e errStepsTookEffect) Unwrap() error { return ErrInProgress }

// StatusCode reports the HTTP status DefaultErrorHandler uses for err.
func StatusCode(err error) int { return problemFor(err).status }
