package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"
)

// A Key identifies one logical call of a function, for Do: a queue
// message, a webhook delivery, a job. Do runs the function once per
// (Scope, ID); every other call with them gets the stored result.
type Key struct {
	// Scope is whom the ID belongs to (a sender, a queue, a tenant): IDs of
	// two scopes never meet. "" is a scope of its own. Keys of Do never
	// meet the keys of HTTP requests, whatever their scope.
	Scope string
	// ID is the idempotency key: a message id, a delivery id, an order
	// number. At most the middleware's key length (WithMaxKeyLength) and
	// printable ASCII, as for a request's key.
	ID string
	// Input is what the call is about, e.g. the message body. It is
	// fingerprinted: the same ID with other Input is refused with
	// ErrKeyReused instead of answered with another input's result.
	Input []byte
}

// A Codec turns a function's result into the bytes that are stored for
// duplicates, and back. JSON is the default. What Marshal makes of a
// result must Unmarshal to an equal result: Do checks, before it stores
// the result, that the bytes decode to what the result is, whatever the
// codec (see CheckResult). A result that fails is not stored for replay
// (see Do).
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default Codec, encoding/json. A result type must survive it:
// exported fields, no cycles. It marshals a result as encoding/json does a
// value behind a pointer, so that a MarshalJSON or MarshalText declared on
// a pointer type is called, as its Unmarshal counterpart is.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(addressable(v)) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// addressable is v behind a pointer to a copy of it, or v itself when it
// is a pointer or nil. encoding/json calls a MarshalJSON or MarshalText
// declared on a type's pointer only where it can address the value, of
// the result and of each field in it, and decoding always can: a result
// marshalled as it was handed in would skip the method that its decoding
// calls, and come back other than it went.
func addressable(v any) any {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Kind() == reflect.Pointer {
		return v
	}
	p := reflect.New(rv.Type())
	p.Elem().Set(rv)
	return p.Interface()
}

// A DoOption configures one Do call.
type DoOption func(*doConfig)

type doConfig struct {
	codec       Codec
	storeErrors bool
	resume      bool
	outcome     *Outcome
}

// UseCodec stores results with codec instead of JSON.
func UseCodec(codec Codec) DoOption { return func(c *doConfig) { c.codec = codec } }

// StoreErrors stores an error the function returns, like a result: every
// duplicate gets it back (as a *StoredError) and the function never runs
// again for the key. Use it when the function may have had side effects
// before it failed. Without it an error releases the key, so that a retry
// (a redelivered message) runs the function again, like a panic does.
func StoreErrors() DoOption { return func(c *doConfig) { c.storeErrors = true } }

// Resumable makes the call's run resumable, as WithResume does for every
// key of a Middleware: a call that finds the key's run abandoned (its
// instance died, or it ended kept) takes it over and runs fn again, each
// Step that run journaled returning its journaled result. A function error
// after a journaled step keeps the key rather than release it, so that the
// next call resumes past that step.
func Resumable() DoOption { return func(c *doConfig) { c.resume = true } }

// ReportOutcome sets *o to how Do answered: Executed when this call ran
// fn, Replayed or Waited when it returned a stored result (Waited: after
// waiting for a run in progress), and Conflict, Rejected, StoreError or
// ClientGone when it returned a problem. A queue consumer counts with it,
// or acks differently a message that was already handled.
func ReportOutcome(o *Outcome) DoOption { return func(c *doConfig) { c.outcome = o } }

// StoredError is what a duplicate gets when the function's first run
// returned an error and StoreErrors kept it, and what a resumed run's Step
// returns for a step whose Permanent error was journaled. Its Message is
// the error's text; where the codec carried the error itself (see
// ErrorCodec), it unwraps to the error the codec gave back.
type StoredError struct {
	Message string
	err     error
}

func (e *StoredError) Error() string { return e.Message }

// Unwrap is the error the codec gave back (ErrorCodec), or nil.
func (e *StoredError) Unwrap() error { return e.err }

// An ErrorCodec is a Codec that also carries a step's Permanent error
// whole, beyond its message: Step journals what MarshalError makes of it,
// and a resumed run's Step returns a *StoredError that unwraps to what
// UnmarshalError gives back, so that errors.As finds what the error was (a
// gRPC status, whose code the caller must get again). grpcidem's codec is
// one.
type ErrorCodec interface {
	Codec
	// MarshalError encodes err, or reports false for an error it does
	// not carry (then Step journals its message only).
	MarshalError(err error) ([]byte, bool)
	// UnmarshalError gives back the error MarshalError encoded in data.
	UnmarshalError(data []byte) (error, error)
}

// Statuses of a function's stored answer: the result, or an error.
const (
	statusResult      = 200
	statusStoredError = 500
)

// Do runs fn at most once per key, under the same protocol as a protected
// HTTP route (see the package documentation): a Redis lock with a lease, a
// fencing token in fn's context (FencingToken), duplicates that wait for a
// running call in this process and on other instances, the stored result
// replayed to every duplicate, the in-process cache and the observer (its
// Event has no Request).
//
// The first call returns what fn returned; when its result cannot come
// back to duplicates as it was (the codec cannot encode it, its bytes do
// not decode, or JSON would alter it: see Codec), the result together with
// an error that wraps ErrNotReplayable: fn ran, and the key is kept as
// executed and not replayable. A duplicate returns the stored
// result, decoded by the codec; or ErrInProgress when the first call still
// runs after the middleware's wait timeout, ErrKeyReused when its Input
// differs, ErrInterrupted when an earlier run ended without a result (its
// instance died), ErrNotReplayable when the result was larger than
// WithMaxResponseBytes or could not be stored for replay, or an error wrapping
// ErrStoreUnavailable when Redis does not answer (then fn did not run). An
// error of fn's that wraps ErrStoreUnavailable (sqlidem.Run's, when its
// database failed) is returned as one that wraps ErrInProgress instead once
// a step of the run took effect: the run is kept for a retry to resume,
// and "not executed" would be false.
//
// fn's context is not cancelled when ctx is: once started, fn finishes
// (within WithExecutionTimeout), so that a retry finds its result; it is
// cancelled with ErrLockLost if the lease is lost. fn may call Release to
// give the key up. Under WithFailOpen a Redis that does not answer lets fn
// run unprotected instead: with ctx itself, no fencing token, nothing
// stored.
func Do[T any](ctx context.Context, m *Middleware, key Key, fn func(ctx context.Context) (T, error), opts ...DoOption) (T, error) {
	cfg := doConfig{codec: JSON}
	for _, o := range opts {
		o(&cfg)
	}
	var zero T
	now := time.Now()
	c := &call{ctx: ctx, start: now, deadline: now.Add(m.cfg.wait), scope: key.Scope, key: key.ID,
		resume: m.cfg.resume || cfg.resume}
	work := &funcRun[T]{m: m, c: c, fn: fn, cfg: &cfg}
	c.work = work

	// Refusals too reach the observer, as a request's do.
	v := m.conclude(c, func() verdict {
		switch {
		case key.ID == "":
			return refuse(ErrMissingKey)
		case !validKey(key.ID, m.cfg.maxKeyLen):
			return refuse(ErrInvalidKey)
		case ctx.Err() != nil:
			return verdict{outcome: ClientGone, err: ctx.Err()} // a caller that is gone starts nothing
		}
		c.id = identityOfKind('f', key.Scope, key.ID)
		c.fp = inputFingerprint(key.Input)
		return m.throughKey(c)
	})
	if cfg.outcome != nil {
		*cfg.outcome = v.outcome
	}
	switch v.outcome {
	case Executed, Unprotected:
		if work.x != nil {
			work.err = work.x.truthful(work.err) // no "not executed" once a step took effect
		}
		if work.err != nil && (errors.Is(v.err, ErrLockLost) || errors.Is(v.err, ErrExecutionTimeout)) {
			// The middleware cut fn off, and the key is kept: say why.
			return work.value, fmt.Errorf("%w: %w", v.err, work.err)
		}
		if work.err == nil && work.unreplayable != nil {
			return work.value, work.unreplayable // fn ran; the result is its, duplicates get none
		}
		return work.value, work.err
	case Replayed, Waited:
		return decodeResult[T](cfg.codec, v.rec)
	case ClientGone:
		return zero, ctx.Err()
	}
	return zero, v.err
}

// funcRun is Do's adapter over a key's lifecycle (lifecycle.go): it runs
// the function and turns its result into the record duplicates get.
type funcRun[T any] struct {
	m        *Middleware
	c        *call
	fn       func(context.Context) (T, error)
	cfg      *doConfig
	value    T
	err      error
	returned bool
	// unreplayable says why the result, which fn returned, is not stored
	// for replay: the first call returns it too (see CheckResult).
	unreplayable error
	x            *execution // the run's, once it began
}

func (f *funcRun[T]) run(ctx context.Context, x *execution) *record {
	x.codec = f.cfg.codec
	f.x = x
	f.value, f.err = f.fn(ctx)
	// Once a step took effect, "not executed" is false, and the error that
	// says so is no answer to store: the run is kept for a retry.
	f.err = x.truthful(f.err)
	f.returned = true
	var rec *record
	switch {
	case f.err != nil && !f.cfg.storeErrors:
		return nil // released, or kept: nothing is stored, so nothing is encoded
	case f.err != nil:
		rec = &record{status: statusStoredError, body: []byte(f.err.Error())}
	default:
		body, err := f.cfg.codec.Marshal(f.value)
		if err == nil && len(body) > f.m.cfg.maxResponse {
			// Refused before the round-trip check, which would decode a
			// copy as large as the result only to refuse it.
			return nil // kept as executed, not replayable
		}
		if err == nil {
			err = CheckResult(f.cfg.codec, f.value, body)
		} else {
			err = errNotRoundTrip{fmt.Errorf("it does not encode: %w", err)}
		}
		if err != nil {
			// fn ran: giving the key up would let a retry run it again. It
			// is kept as executed and not replayable, like an answer too
			// large.
			f.m.cfg.logger.Error("idempotency: a function's result cannot be stored for replay; duplicates get ErrNotReplayable",
				"key", x.key, "error", err)
			f.unreplayable = err
			return nil
		}
		rec = &record{status: statusResult, body: body}
	}
	if len(rec.body) > f.m.cfg.maxResponse {
		return nil // kept as executed, not replayable
	}
	return rec
}

// decide: an error releases the key, so that a retry (a redelivered
// message) runs fn again, unless StoreErrors keeps it.
func (f *funcRun[T]) decide(*execution) StoreDecision {
	return StoreDecision{Release: f.err != nil && !f.cfg.storeErrors, TTL: f.m.cfg.recordTTL}
}

// succeeded: fn returned no error.
func (f *funcRun[T]) succeeded() bool { return f.err == nil }

// committed: once fn has returned, its effects are done.
func (f *funcRun[T]) committed() bool { return f.returned }

// unprotected runs fn with the caller's own context: no fencing token,
// nothing stored (WithFailOpen while Redis is down).
func (f *funcRun[T]) unprotected() { f.value, f.err = f.fn(f.c.ctx) }

// inputFingerprint is a function call's fingerprint: its input's digest,
// under a label of its own so that it never equals a request's.
func inputFingerprint(input []byte) fingerprintSum {
	h := sha256.New()
	h.Write([]byte("idempotency/do\x00"))
	h.Write(input)
	var fp fingerprintSum
	h.Sum(fp[:0])
	return fp
}

// decodeResult reads a stored answer of Do.
func decodeResult[T any](codec Codec, rec *record) (T, error) {
	var v T
	switch rec.status {
	case statusResult:
		if err := codec.Unmarshal(rec.body, &v); err != nil {
			return v, fmt.Errorf("%w: %w", ErrUnreadableRecord, err)
		}
		return v, nil
	case statusStoredError:
		return v, &StoredError{Message: string(rec.body)}
	}
	// The key's answer came from an HTTP request: keys of Do never meet
	// those, so this is another program's record under our prefix.
	return v, errors.Join(ErrUnreadableRecord, fmt.Errorf("idempotency: stored status %d is not a function's", rec.status))
}
