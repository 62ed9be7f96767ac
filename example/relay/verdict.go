package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/onceonly/idempotency"
)

// An action is what the relay does with a message once its side effect has
// answered: the endpoint in HTTP mode, Do in the in-process mode.
type action int

const (
	// ack: the endpoint has the event (a first run or a replay).
	ack action = iota
	// retry: negative-acknowledge with a delay; the broker redelivers.
	retry
	// deadLetter: publish to the dead-letter subject, then terminate, since
	// no redelivery can succeed.
	deadLetter
)

func (a action) String() string {
	return [...]string{"ack", "retry", "dead-letter"}[a]
}

// verdict is the relay's decision about one answer.
type verdict struct {
	action action
	delay  time.Duration // retry only
	reason string        // why, for logs and the dead-letter headers
}

// retryPolicy bounds redelivery delays and failing attempts.
type retryPolicy struct {
	// base is the delay of a retry the endpoint gave no Retry-After for,
	// doubled with every delivery up to max.
	base, max time.Duration
	// maxServerErrors is how many deliveries a message answered with a
	// plain 5xx gets before it is dead-lettered: the middleware stores and
	// replays such an answer, so retrying it is usually futile.
	maxServerErrors uint64
}

// answer is what the relay keeps of an HTTP response, or of Do's outcome
// read as the response the middleware would have sent (doAnswer).
type answer struct {
	status     int
	retryAfter string
	problem    string // the problem slug of an idempotency rejection, if any
	replayed   bool
	// detail is why Process failed, in its words. The HTTP mode has none:
	// an endpoint's error stays in the endpoint's logs.
	detail string
}

// readAnswer reads the status, Retry-After and the problem type of a
// response, and drains a bounded part of its body.
func readAnswer(resp *http.Response) answer {
	a := answer{
		status:     resp.StatusCode,
		retryAfter: resp.Header.Get("Retry-After"),
		replayed:   resp.Header.Get(idempotency.ReplayedHeader) == "true",
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(body, &p) == nil {
			a.problem = strings.TrimPrefix(p.Type, idempotency.ProblemTypeBase)
		}
	}
	return a
}

// judge decides what an answer means for the message, on its delivered-th
// delivery. The idempotency key is what makes retrying safe: whatever ran
// is replayed, never run again.
func (p retryPolicy) judge(a answer, delivered uint64, now time.Time) verdict {
	v := p.judgeStatus(a, delivered, now)
	if v.action != ack && a.detail != "" {
		v.reason += ": " + a.detail
	}
	return v
}

func (p retryPolicy) judgeStatus(a answer, delivered uint64, now time.Time) verdict {
	switch s := a.status; {
	case s >= 200 && s < 300:
		return verdict{action: ack}
	case s == http.StatusConflict:
		switch a.problem {
		case "in-progress": // another delivery of it is running: ask again later
			return verdict{action: retry, delay: p.delay(a.retryAfter, delivered, now), reason: "in progress"}
		case "not-replayable": // it ran; only its answer is not stored
			return verdict{action: ack}
		case "interrupted": // it may or may not have run: a person decides
			return verdict{action: deadLetter, reason: "interrupted: the execution that claimed it vanished"}
		}
		if a.retryAfter != "" {
			return verdict{action: retry, delay: p.delay(a.retryAfter, delivered, now), reason: "conflict"}
		}
		return verdict{action: deadLetter, reason: "conflict " + a.problem}
	case s == http.StatusTooManyRequests, s == http.StatusBadGateway,
		s == http.StatusServiceUnavailable, s == http.StatusGatewayTimeout:
		return verdict{action: retry, delay: p.delay(a.retryAfter, delivered, now), reason: http.StatusText(s)}
	case s >= 500 && delivered < p.maxServerErrors:
		// In-process, the failed run released the key, so a retry
		// runs Process again.
		return verdict{action: retry, delay: p.delay(a.retryAfter, delivered, now), reason: http.StatusText(s)}
	}
	// 422 key-reused (same id, different body) and every other 4xx will be
	// answered the same way forever; so will a stored 5xx after its
	// attempts, and a redirect.
	reason := strconv.Itoa(a.status) + " " + http.StatusText(a.status)
	if a.problem != "" {
		reason += ": " + a.problem
	}
	return verdict{action: deadLetter, reason: reason}
}

// delay honours Retry-After (seconds or an HTTP date) and otherwise backs
// off exponentially with the delivery count; both are capped at max.
func (p retryPolicy) delay(retryAfter string, delivered uint64, now time.Time) time.Duration {
	if retryAfter != "" {
		if secs, err := strconv.ParseInt(retryAfter, 10, 64); err == nil && secs >= 0 {
			return min(time.Duration(min(secs, 1<<20))*time.Second, p.max)
		}
		if at, err := http.ParseTime(retryAfter); err == nil {
			return min(max(at.Sub(now), 0), p.max)
		}
	}
	d := p.base
	for i := uint64(1); i < delivered && d < p.max; i++ {
		d *= 2
	}
	return min(d, p.max)
}

// Permanent marks an error of Process that no redelivery can fix (an
// event that cannot be read, an order that cannot exist): the relay
// dead-letters the message at once instead of retrying it.
func Permanent(err error) error { return permanentError{err} }

type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// problemTypes are the middleware's problem slugs (stable, listed in the
// README) for the errors Do returns, as DefaultErrorHandler would answer
// them.
var problemTypes = []struct {
	err  error
	slug string
}{
	{idempotency.ErrInProgress, "in-progress"},
	{idempotency.ErrNotReplayable, "not-replayable"},
	{idempotency.ErrInterrupted, "interrupted"},
	{idempotency.ErrKeyReused, "key-reused"},
	{idempotency.ErrUnreadableRecord, "unreadable-record"},
	{idempotency.ErrStoreUnavailable, "store-unavailable"},
	{idempotency.ErrInvalidKey, "invalid-key"},
	{idempotency.ErrMissingKey, "missing-key"},
}

// doAnswer reads the outcome of Do as the answer the middleware would have
// sent for it, so that one judge settles both modes alike: success is a
// 200 (replayed unless this delivery ran Process), Do's errors get their
// status (idempotency.StatusCode), problem slug and Retry-After
// (idempotency.RetryAfter, in whole seconds rounded up as the header
// carries it), and an error of Process's own is the 500 of a failed
// handler, or a 422 when it is Permanent.
func doAnswer(err error, ran bool) answer {
	switch {
	case err == nil:
		return answer{status: http.StatusOK, replayed: !ran}
	case errors.As(err, new(permanentError)):
		return answer{status: http.StatusUnprocessableEntity, detail: err.Error()}
	case ran:
		return answer{status: http.StatusInternalServerError, detail: err.Error()}
	}
	a := answer{status: idempotency.StatusCode(err)}
	for _, p := range problemTypes {
		if errors.Is(err, p.err) {
			a.problem = p.slug
			break
		}
	}
	if a.problem == "" {
		// A stored error of an earlier run (idempotency.StoredError), or
		// the relay's context ending.
		a.detail = err.Error()
	}
	if d := idempotency.RetryAfter(err); d > 0 {
		a.retryAfter = strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
	}
	return a
}
