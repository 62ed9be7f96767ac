package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// Step runs fn as the step name of the protected execution that ctx belongs
// to, and journals its result with the key before it returns. In a
// resumable execution (WithResume, Resumable) that takes over a run whose
// executor died, a step that run journaled returns its journaled result
// without running fn again; the first step it did not journal runs. So a
// handler that is run again from the top after a crash does each journaled
// step once, and the answer it builds from their results is the answer the
// first run would have built.
//
// A step must make its work safe to repeat: the executor may die after fn's
// effect and before the journal has it, and then the step runs again. Pass
// StepKey(ctx, name) to an external API as that call's own idempotency key,
// and the call repeated is one call.
//
// What is journaled: a result, encoded with the execution's codec (JSON, or
// Do's UseCodec), with the journal of one execution (its entries whole,
// names and framing too) at most WithMaxResponseBytes; JSON brings back
// what encoding/json carries (see CheckResult): a time.Time's instant and
// offset but not its zone's name, and one value behind two pointers as
// two. And an error that fn marks Permanent, whose message a
// resumed run gets back as a *StoredError. Any other error, and a
// cancellation or deadline (even one marked Permanent), is not journaled:
// Step returns it, and a resumed run runs the step again, with the same
// StepKey. That is the rule for a payment: a decline is a final answer,
// worth keeping, while a timeout or a 5xx from the provider says nothing
// about whether the charge happened, and asking again with the same key is
// how to find out.
//
// When fn succeeded but its result cannot be journaled, Step returns the
// result with an error: ErrStepTooLarge past the journal's limit, an error
// wrapping ErrNotReplayable when the codec cannot carry the result back
// exactly (see Codec), ErrStoreUnavailable when Redis did not take it, or
// ErrLockLost when the key is no longer this execution's. The step's effect
// has happened; a resumed run runs it again. A key's record that vanished
// (Redis restarted empty, an eviction) is no such error: the step returns
// its result, and the store of the run's answer writes the record back. A run whose step Redis did not
// take is kept unless its answer is a success (a 2xx, or Do's nil error), so
// that a retry resumes it rather than replay a failure built on an effect
// that did happen.
//
// A run the middleware cut off (the execution timeout, or a lost lease
// where another executor may take the key over) starts no step: Step
// returns the cause (ErrExecutionTimeout, ErrLockLost) without running fn,
// whatever context the handler passes it, since the run that resumes the
// key may already have done the step. Nor does a resumable run whose
// ownership of the key Redis no longer proves (an executor paused past its
// lease wakes before its timers fire): the claim, and each step's journal
// write, prove it for as long as the run's lock had left then; a step that
// starts later asks Redis first (one command more), and returns
// ErrLockLost, or ErrStoreUnavailable, without running fn when the proof
// fails. Such a run is kept unless it succeeds.
//
// Step names are unique within an attempt of an execution: a second Step
// with a name already used returns ErrStepRepeated without running fn
// (name steps in a loop after what they are about: "charge-" + item.ID).
// An attempt that runs the work again within the execution (NextAttempt:
// a transaction sqlidem runs again) gets each step its earlier attempts
// finished back, without running it. Outside a protected
// execution (an unprotected method, WithOptionalKey without a key,
// WithFailOpen while Redis is down, no middleware) Step runs fn plainly; so
// does it in a protected execution that is not resumable, which journals
// nothing but still refuses a repeated name.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	x, _ := ctx.Value(executionKey).(*execution)
	if x == nil {
		return fn(ctx)
	}
	j := x.journal()
	var zero T
	e, done, err := j.begin(name, attemptOf(ctx))
	switch {
	case err != nil:
		return zero, err
	case done != nil:
		return doneStep[T](name, done)
	case e != nil:
		return replayStep[T](x.resultCodec(), e)
	}
	if cut := cutOff(x.run); cut != nil {
		// The run was cut off: its key may be resumed elsewhere already,
		// and this step done there. Starting it here would repeat it.
		return zero, fmt.Errorf("idempotency: step %q not started: %w", name, cut)
	}
	if j.resumable {
		// A context that was not cancelled proves nothing after a pause
		// (its timers fire late): ask Redis, unless a recent answer did.
		if err := j.prove(ctx, name); err != nil {
			return zero, err
		}
	}
	j.start()
	v, err := fn(ctx)
	finished := err == nil || journaledError(ctx, err)
	if j.resumable {
		err = journalStep(ctx, x, j, name, v, err)
	}
	if finished {
		j.finish(name, v, err)
	}
	return v, err
}

// journalStep journals the outcome of the step name, whose function
// returned v and err, and returns the error Step returns.
func journalStep[T any](ctx context.Context, x *execution, j *journal, name string, v T, err error) error {
	if err != nil {
		if !journaledError(ctx, err) {
			return err
		}
		kind, data := byte(entryError), []byte(err.Error())
		if ec, ok := x.resultCodec().(ErrorCodec); ok {
			if b, ok := ec.MarshalError(err); ok {
				kind, data = entryCodedError, b
			}
		}
		if jerr := j.write(ctx, name, kind, data); jerr != nil {
			return fmt.Errorf("%w (the step failed: %w)", jerr, err)
		}
		return err
	}
	codec := x.resultCodec()
	body, err := codec.Marshal(v)
	if err == nil {
		// Past the journal's limit the result is refused before the
		// round-trip check, which would decode a copy as large as it.
		if err := j.fits(name, body); err != nil {
			return err
		}
		err = CheckResult(codec, v, body)
	} else {
		err = errNotRoundTrip{fmt.Errorf("it does not encode: %w", err)}
	}
	if err != nil {
		return fmt.Errorf("idempotency: step %q: its result cannot be journaled: %w", name, err)
	}
	return j.write(ctx, name, entryResult, body)
}

// doneStep returns what an earlier attempt of the run got from the step
// name.
func doneStep[T any](name string, d *stepDone) (T, error) {
	v, ok := d.v.(T)
	if !ok {
		return v, fmt.Errorf("%w: %q returned a %T in an earlier attempt, and is asked for a %T now",
			ErrStepRepeated, name, d.v, v)
	}
	return v, d.err
}

// NextAttempt returns the context for doing the work of the protected
// execution that ctx belongs to once more, within the same execution: a
// transaction that the database aborted (a serialization failure, a
// deadlock) and that runs again, steps and all. Under it a Step name that
// an earlier attempt used may be used again, and a step whose function
// finished in an earlier attempt returns what Step returned then, without
// running: the effect happened once, and every attempt of the run builds
// on its result. sqlidem calls it for each attempt after the first.
// Outside a protected execution it returns ctx.
func NextAttempt(ctx context.Context) context.Context {
	x, _ := ctx.Value(executionKey).(*execution)
	if x == nil {
		return ctx
	}
	return context.WithValue(ctx, attemptKey, x.attempts.Add(1))
}

var attemptKey = &contextKey{"attempt"}

// attemptOf is the attempt of its execution that ctx belongs to: 0 for the
// first.
func attemptOf(ctx context.Context) int32 {
	n, _ := ctx.Value(attemptKey).(int32)
	return n
}

// StepKey returns the idempotency key for the step name of the protected
// execution that ctx belongs to: to be passed to an external API (a
// payment provider's Idempotency-Key) so that a step run again after a
// crash is the same call. It is the same for every execution of the key
// (the first, and each that resumes it), differs for every step name, and
// is derived from the key's record name and the request's fingerprint, so
// two callers never share one (under WithScope the record name binds the
// caller, under WithCallerCredentials the fingerprint does). It holds no
// secret, so that every instance derives it alike whatever secrets rotate:
// it names a call, and grants nothing. 32 hex digits. Outside a protected
// execution it returns "", and the call should then carry no key of ours.
func StepKey(ctx context.Context, name string) string {
	x, _ := ctx.Value(executionKey).(*execution)
	if x == nil {
		return ""
	}
	h := sha256.New()
	h.Write([]byte("idempotency/step\x00"))
	h.Write([]byte(x.key))
	h.Write([]byte{0})
	h.Write(x.fp[:])
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// Permanent marks err as a step's final answer: Step journals it, and a
// resumed run gets it back (as a *StoredError with its message, which
// unwraps to the error itself where the codec carries it: ErrorCodec) instead of
// running the step again. Mark what another call would answer the same
// way (a declined card, a validation failure), never a timeout. Permanent
// of nil is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

var (
	// ErrStepRepeated is what Step returns, without running its function,
	// for a name already used in the same execution.
	ErrStepRepeated = errors.New("idempotency: step name already used in this execution")
	// ErrStepTooLarge is what Step returns, with the step's result, when the
	// result would take the execution's journal past WithMaxResponseBytes:
	// the step ran, and nothing of it is journaled.
	ErrStepTooLarge = errors.New("idempotency: step result too large to journal")
)

// journaledError reports whether fn's error err is a final answer to
// journal: marked Permanent, and no cancellation (the run was cut off, or
// fn's own deadline passed: another try may succeed).
func journaledError(ctx context.Context, err error) bool {
	var p *permanentError
	return errors.As(err, &p) && ctx.Err() == nil &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// replayStep returns a journaled step's result.
func replayStep[T any](codec Codec, e *journalEntry) (T, error) {
	var v T
	switch e.kind {
	case entryError:
		return v, &StoredError{Message: e.data}
	case entryCodedError:
		ec, ok := codec.(ErrorCodec)
		if !ok {
			return v, fmt.Errorf("%w: step %q: its error was journaled by a codec that carries errors, and this one does not",
				ErrUnreadableRecord, e.name)
		}
		err, derr := ec.UnmarshalError([]byte(e.data))
		if derr != nil || err == nil {
			return v, fmt.Errorf("%w: step %q: its error: %w", ErrUnreadableRecord, e.name, derr)
		}
		return v, &StoredError{Message: err.Error(), err: err}
	}
	if err := codec.Unmarshal([]byte(e.data), &v); err != nil {
		return v, fmt.Errorf("%w: step %q: %w", ErrUnreadableRecord, e.name, err)
	}
	return v, nil
}
