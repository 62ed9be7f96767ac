package idempotency

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// retryable reports whether resp says that the same request with the same
// key may get another answer later: 409 in-progress (the first attempt is
// still running) or 503 with Retry-After (nothing ran). Every other answer
// would come back the same, 422 key-reused and the 409s of a request that
// ran (not-replayable, interrupted, unreadable-record) above all. So does a
// replay, whatever its status: a 503 that the handler answered and the
// middleware stored is the key's answer, and every retry would only get
// that stored copy again.
func retryable(resp *http.Response) bool {
	if resp.Header.Get(ReplayedHeader) == "true" {
		return false
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable:
		return resp.Header.Get("Retry-After") != ""
	case http.StatusConflict:
		return problemType(resp) == ProblemTypeBase+problemFor(ErrInProgress).slug
	}
	return false
}

// problemSniff bounds what problemType reads of a body: a problem of this
// package is a few hundred bytes, and anything longer is not one.
const problemSniff = 4 << 10

// problemType reads the RFC 9457 type of a problem+json body, or "", and
// leaves resp.Body as it was for whoever reads it next.
func problemType(resp *http.Response) string {
	head, _ := io.ReadAll(io.LimitReader(resp.Body, problemSniff))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(head, &p) != nil {
		return ""
	}
	return p.Type
}

// wait is how long to pause before the attempt after attempt: what resp's
// Retry-After asks, else the back-off, and never more than MaxDelay.
func (t *Transport) wait(resp *http.Response, attempt int) time.Duration {
	maxDelay := t.MaxDelay
	if maxDelay <= 0 {
		maxDelay = defaultMaxDelay
	}
	if resp != nil {
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return min(d, maxDelay)
		}
	}
	base := t.BaseDelay
	if base <= 0 {
		base = defaultBaseDelay
	}
	return backoff(base, maxDelay, attempt)
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP date
// (RFC 9110 §10.2.3). A date already past is no answer: the clocks disagree,
// and the back-off is a better guess than retrying at once.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil || at.Before(now) {
		return 0, false
	}
	return at.Sub(now), true
}

// backoff doubles from base per attempt up to maxDelay, and picks at random
// in the upper half of that, so that clients that failed together do not
// all retry together.
func backoff(base, maxDelay time.Duration, attempt int) time.Duration {
	ceiling := maxDelay
	if shift := attempt - 1; shift < 32 && base < maxDelay>>shift {
		ceiling = base << shift
	}
	half := ceiling / 2
	return half + rand.N(ceiling-half+1)
}

// drainLimit bounds what is read of an answer that is retried: enough for
// any "try again" answer, so its connection is reused, and no more.
const drainLimit = 64 << 10

func drain(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	body.Close()
}

// retryableError reports whether a transport error may pass on a resend.
// Not a server certificate the client refuses, nor a request it cannot
// send at all (an unsupported scheme): those fail alike every time, and
// waiting between them only delays the answer.
func retryableError(err error) bool {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return false
	case strings.Contains(err.Error(), "unsupported protocol scheme"):
		return false // net/http's error for it is not exported
	}
	return true
}
