// Package client is the client side of the idempotency middleware: an
// http.RoundTripper that sends one Idempotency-Key with every retry of a
// request, so that a lost answer turns into a replay instead of a second
// execution. It needs no Redis: a program that only calls protected
// endpoints imports this package and not the middleware.
package client

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// KeyHeader carries the key of a request, as the middleware reads it.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader marks an answer that the middleware replayed from its
// store: "true" when an earlier attempt ran the request.
const ReplayedHeader = "Idempotent-Replayed"

// inProgressProblem is the RFC 9457 type of the middleware's 409 that says
// the first attempt still runs: the one conflict worth retrying.
const inProgressProblem = "https://github.com/onceonly/idempotency/blob/main/README.md#problem-in-progress"

// Transport is an http.RoundTripper for clients of endpoints that this
// package protects: it gives each request of a keyed method (POST and PATCH
// unless Methods says otherwise) one Idempotency-Key, and retries it with
// that same key when a retry cannot run it twice: after a failure of the
// connection (refused, reset, closed before the whole answer, timed out;
// the key turns a lost answer into a replay; an HTTP/2 stream reset with
// INTERNAL_ERROR or REFUSED_STREAM likewise), a gateway's 502 or 504 (a
// proxy lost the answer or never got it), a 409 in-progress (the first
// attempt still runs) and a 503 (with Retry-After, nothing ran; without,
// a timeout outside the middleware gave up on a handler that went on). A
// replayed answer (Idempotent-Replayed: true) is never retried, whatever
// its status: it is the key's stored answer, and a retry would get it
// again. Nor is an
// error that the request itself causes (an invalid header or URL, an
// unsupported scheme, a TLS handshake that cannot succeed): it is returned
// after one attempt.
//
// A handler that panics before its status went out is a case of its own:
// the middleware releases the key (nothing of the run counts as executed),
// so a resend runs the handler again. net/http's server resets its HTTP/2
// stream with INTERNAL_ERROR and closes its HTTP/1 connection, neither of
// which can be told from an answer a proxy or the network lost, so the
// Transport retries, and a handler that panics every time runs
// MaxAttempts times. Put a recoverer outside the middleware on protected
// routes: it answers the panic with a 500, which is returned after one
// attempt over either protocol.
//
//	hc := &http.Client{Transport: &client.Transport{}}
//	resp, err := hc.Post(url, "application/json", strings.NewReader(`{"amount":500}`))
//	// resp.Header.Get(client.ReplayedHeader) == "true" when an earlier
//	// attempt ran the request and this is its stored answer.
//
// A request that already carries an Idempotency-Key keeps it, on every
// attempt. Otherwise (no such header, or one with no value or only empty
// ones) the key is a random UUID (version 4), made per call of
// RoundTrip and never written into the caller's request, so it cannot leak
// into another request. Each attempt sends a clone of the request, and
// attempts after the first read the body again through req.GetBody
// (http.NewRequest sets it for in-memory bodies); a request with a body and
// no GetBody is sent once and never retried. Requests of other methods are
// passed to Base untouched.
//
// It waits before each retry as the answer's Retry-After says (seconds or
// an HTTP date), else a jittered back-off from BaseDelay that doubles per
// attempt; no wait is longer than MaxDelay. A wait that would end after the
// request context's deadline is not started: the last answer (or error) is
// returned at once. A cancelled context ends a wait at once with the
// context's error. The bodies of answers that are retried are drained and
// closed; the last answer is returned as is, headers and body, so that a
// replay is visible.
//
// A connection that fails under the answer's body, after its headers came,
// loses nothing either: the body sends the request again under the same
// key, while attempts are left, and goes on from the replay of the stored
// answer once the replay proves to be the same answer (marked replayed, of
// the same status and encoding, its first bytes the ones already read),
// and its trailers become the answer's; otherwise the read returns the
// failure as it came. The key is on resp.Request.Header.
//
// A body that stalls after its headers never holds RoundTrip, even for a
// request with no deadline. A 409's problem type is waited for at most a
// second: a 409 whose problem has not come whole by then is not known to
// be in-progress, and is returned, its body whole to the caller (the bytes
// read so far first). The rest of an answer that is retried is read during
// the wait before the retry and at most 100 ms in all; one that has not
// come by then is closed, its connection with it.
//
// A Transport is safe for concurrent use.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper
	// Methods are the methods that get a key and retries. Nil means POST
	// and PATCH.
	Methods []string
	// MaxAttempts bounds the attempts of one request, the first included.
	// 0 means 5; 1 sends a key and never retries.
	MaxAttempts int
	// BaseDelay is the back-off before the first retry when the answer
	// names no Retry-After; it doubles per attempt. 0 means 250 ms.
	BaseDelay time.Duration
	// MaxDelay caps every wait, a Retry-After's included. 0 means 5 s.
	MaxDelay time.Duration
}

const (
	defaultAttempts  = 5
	defaultBaseDelay = 250 * time.Millisecond
	defaultMaxDelay  = 5 * time.Second
)

// keyedMethods are the methods a Transport keys unless told otherwise: the
// ones HTTP does not define as idempotent (RFC 9110 §9.2.2), so that only
// a key makes resending them safe.
var keyedMethods = []string{http.MethodPost, http.MethodPatch}

// RoundTrip sends req, once or more with one key, and returns the last
// answer. It implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.keys(req.Method) {
		return t.base().RoundTrip(req)
	}
	key, err := requestKey(req.Header)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	return t.send(req, key)
}

// send runs the attempts of one request. The answer's body resumes, under
// the same key, when the connection fails under it (resume.go), with the
// attempts left.
func (t *Transport) send(req *http.Request, key string) (*http.Response, error) {
	attempts := t.attempts()
	if !resendable(req) {
		attempts = 1
	}
	resp, used, err := t.sendFrom(req, key, 1, attempts)
	// A 101's body is the upgraded connection, read and written: it is
	// no answer to resume, and it must stay an io.ReadWriteCloser.
	if err == nil && used < attempts && key != "" && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = newResumingBody(t, req, key, resp, used, attempts)
	}
	return resp, err
}

// sendFrom runs attempts first to attempts of one request, and returns the
// last answer with the number of the attempt that got it.
func (t *Transport) sendFrom(req *http.Request, key string, first, attempts int) (*http.Response, int, error) {
	ctx := req.Context()
	for attempt := first; ; attempt++ {
		try, err := attemptOf(req, key, attempt)
		if err != nil {
			return nil, attempt, err
		}
		base := t.base()
		resp, err := base.RoundTrip(try)
		if resp == nil && err == nil {
			// A broken RoundTripper: answered as http.Client answers it.
			return nil, attempt, fmt.Errorf("client: Base (%T) returned a nil *http.Response with a nil error", base)
		}
		if attempt >= attempts || ctx.Err() != nil || (err == nil && !retryable(ctx, resp)) ||
			(err != nil && !retryableError(err)) {
			return resp, attempt, err
		}
		wait := t.wait(resp, attempt)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			return resp, attempt, err
		}
		// The answer's rest is drained during the wait, and for at most
		// drainGrace in all, then closed.
		var drained <-chan struct{}
		cutoff := time.Now().Add(drainGrace)
		if resp != nil {
			drained = drain(resp.Body)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			if resp != nil {
				resp.Body.Close()
			}
			return nil, attempt, ctx.Err()
		case <-timer.C:
		}
		if resp != nil {
			closeDrained(ctx, resp.Body, drained, cutoff)
		}
		if ctx.Err() != nil {
			return nil, attempt, ctx.Err()
		}
	}
}

// attemptOf is the request that attempt sends: a clone carrying key, with
// the caller's body the first time and a fresh one from GetBody after.
func attemptOf(req *http.Request, key string, attempt int) (*http.Request, error) {
	try := req.Clone(req.Context())
	if try.Header == nil {
		try.Header = http.Header{}
	}
	if key != "" {
		// The caller's header may hold the name with no value, or an empty
		// one, under any spelling: none of it may go out beside the key.
		for name := range try.Header {
			if strings.EqualFold(name, KeyHeader) {
				delete(try.Header, name)
			}
		}
		try.Header.Set(KeyHeader, key)
	}
	if attempt > 1 && req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		try.Body = body
	}
	return try, nil
}

// requestKey is the key to send: the caller's own when it named one (every
// attempt then carries it alone, its blank companions dropped), "" when it
// named several (which every attempt carries as they are, for the server
// to refuse: choosing one would be a guess), else a new random one. A
// header with no value, or only empty or blank ones, names no key: net/http
// sends nothing for a nil entry, and the middleware reads an empty value as
// no key (WithOptionalKey runs the handler unprotected) or refuses it, so
// retrying such a request without a key of ours could run it again. Nor
// does a blank value go out beside a key: the server would refuse the pair
// as a repeated key.
func requestKey(h http.Header) (string, error) {
	var own []string
	for name, values := range h {
		if strings.EqualFold(name, KeyHeader) {
			own = append(own, slices.DeleteFunc(slices.Clone(values), func(v string) bool { return !notBlank(v) })...)
		}
	}
	switch len(own) {
	case 0:
		return newKey()
	case 1:
		return own[0], nil
	}
	return "", nil
}

// newKey is a random key: a version 4 UUID.
func newKey() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// notBlank reports whether a header value holds more than the optional
// white space that a server trims off it.
func notBlank(v string) bool { return strings.Trim(v, " \t") != "" }

// resendable reports whether req's body can be sent again.
func resendable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// closeBody closes the body of a request that is never sent, as the
// RoundTripper contract asks.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// CloseIdleConnections closes Base's idle connections when Base can, so
// that http.Client.CloseIdleConnections reaches them through a Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) keys(method string) bool {
	if t.Methods == nil {
		return slices.Contains(keyedMethods, method)
	}
	return slices.Contains(t.Methods, method)
}

func (t *Transport) base() http.RoundTripper {
	if t.Base == nil {
		return http.DefaultTransport
	}
	return t.Base
}

func (t *Transport) attempts() int {
	if t.MaxAttempts <= 0 {
		return defaultAttempts
	}
	return t.MaxAttempts
}
