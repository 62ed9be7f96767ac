package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// retryable reports whether resp says that the same request with the same
// key may get another answer later: 409 in-progress (the first attempt is
// still running), 503 (with Retry-After, the middleware's: nothing ran;
// without, most often a layer outside it that gave up waiting for the
// handler, http.TimeoutHandler's or a load balancer's, while the handler
// went on to store its answer), or a gateway's 502 or 504 (a proxy lost
// the server's answer, or never got it). The key turns the answer of a run
// that took effect into a replay. Every other answer would come back the
// same, 422 key-reused and the 409s of a request that ran (not-replayable,
// interrupted, unreadable-record) above all. So does a replay, whatever
// its status: a 503 that the handler answered and the middleware stored is
// the key's answer, and every retry would only get that stored copy again
// (the handler's own 503 costs one retry, which gets it replayed).
func retryable(ctx context.Context, resp *http.Response) bool {
	if resp.Header.Get(ReplayedHeader) == "true" {
		return false
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return problemType(ctx, resp) == inProgressProblem
	}
	return false
}

// problemSniff bounds what problemType reads of a body: a problem of this
// package is a few hundred bytes, and anything longer is not one.
const problemSniff = 4 << 10

// stallLimit bounds how long the Transport waits for a 409's problem. The
// middleware writes it with the headers; a body that takes longer has
// stalled, and without this bound a request with no deadline would wait
// for it for ever.
const stallLimit = time.Second

// problemType reads the RFC 9457 type of a problem+json body, or "", and
// leaves resp.Body as it was for whoever reads it next. It reads until the
// body ends, its first problemSniff bytes came or they hold one whole JSON
// value (the rest may stall: drainGrace bounds it), for at most stallLimit
// and no longer than ctx lives: what came by then is read as the body, and
// resp goes back to the caller, who gets every byte of the body, those read
// here first.
func problemType(ctx context.Context, resp *http.Response) string {
	b := sniff(resp.Body)
	resp.Body = b
	timer := time.NewTimer(stallLimit)
	defer timer.Stop()
	for !b.over && !json.Valid(b.head) {
		select {
		case chunk, ok := <-b.chunks:
			b.head = append(b.head, chunk...)
			b.over = !ok
		case <-timer.C:
			return typeOf(b.head)
		case <-ctx.Done():
			return typeOf(b.head)
		}
	}
	return typeOf(b.head)
}

// typeOf is the type of the problem+json body, or "" when body is none.
func typeOf(body []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.Type
}

// A sniffedBody is an answer's body whose first problemSniff bytes a
// goroutine reads and hands over in chunks, so that problemType can stop
// waiting for them: reading it yields the chunks problemType kept, then
// the rest of the chunks as they come, then the body's own rest.
// Closing it closes the body, which ends the goroutine.
type sniffedBody struct {
	body   io.ReadCloser
	chunks chan []byte // the goroutine's reads; closed after the last
	err    error       // what ended the goroutine's reads; set before chunks is closed
	closed chan struct{}
	once   sync.Once

	// The reader's, then, once problemType has returned, the caller's.
	head []byte // received from chunks, not read yet
	over bool   // chunks is closed
}

func sniff(body io.ReadCloser) *sniffedBody {
	b := &sniffedBody{body: body, chunks: make(chan []byte), closed: make(chan struct{})}
	go b.fill()
	return b
}

// fill reads up to problemSniff bytes of the body into chunks.
func (b *sniffedBody) fill() {
	defer close(b.chunks)
	for n := 0; n < problemSniff; {
		buf := make([]byte, problemSniff-n)
		m, err := b.body.Read(buf)
		if m > 0 {
			select {
			case b.chunks <- buf[:m]:
			case <-b.closed:
				return
			}
			n += m
		}
		if err != nil {
			b.err = err
			return
		}
	}
}

func (b *sniffedBody) Read(p []byte) (int, error) {
	if len(b.head) == 0 && !b.over {
		chunk, ok := <-b.chunks
		b.head, b.over = chunk, !ok
	}
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.body.Read(p)
}

func (b *sniffedBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.body.Close()
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

// drainGrace bounds how long the rest of a retried answer is read once the
// wait before the retry began: it is read during the wait, and for at most
// drainGrace in all. A body that takes longer has stalled; it costs its
// connection, never more than drainGrace of delay.
const drainGrace = 100 * time.Millisecond

// drain reads what is left of body, up to drainLimit, in the background,
// so that its connection may serve the next attempt; the channel is closed
// when it is done. It does not close body: closeDrained does.
func drain(body io.Reader) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	}()
	return done
}

// closeDrained closes body once drained is closed, or at the latest at
// cutoff or when ctx ends: a stalled body costs its connection, never the
// retry. Closing the body ends the drain's read.
func closeDrained(ctx context.Context, body io.Closer, drained <-chan struct{}, cutoff time.Time) {
	defer body.Close()
	if d := time.Until(cutoff); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-drained:
		case <-timer.C:
		case <-ctx.Done():
		}
		return
	}
	select {
	case <-drained:
	default:
	}
}

// retryableError reports whether a transport error may pass on a resend:
// only a failure of the connection or of the server's side of it, which
// the next attempt, on another connection, may not meet. That is a socket
// call that failed (connection refused, reset or aborted, a broken pipe, a
// host or network unreachable), a connection closed before the whole
// answer came (EOF, unexpected EOF, a closed connection; inside the
// status line, a header line or the trailers too, cutUnderHeaders and
// cutUnderTrailer), a timeout (the
// dial, the TLS handshake, the answer's headers), a name server that did
// not answer, and an HTTP/2 stream that the server refused, cancelled,
// reset to shed load or for an internal error, or whose connection went
// away.
//
// Everything else fails alike on every attempt, and waiting between them
// only delays the answer: an error of the request itself (an invalid
// header, method or URL, an unsupported scheme), a TLS handshake that
// cannot succeed (a certificate the client refuses, an HTTP server asked
// for HTTPS, a TLS alert), a host name that does not exist, an answer that
// is not HTTP, and whatever else a RoundTripper returns that is not known
// to be a passing failure. The error may come wrapped (a *url.Error from a
// Base built on an http.Client); the chain is what is read.
func retryableError(err error) bool {
	var (
		dns    *net.DNSError
		stream h2StreamError
		sysErr *os.SyscallError
		netErr net.Error
	)
	switch {
	case errors.As(err, &dns):
		return dns.IsTimeout || dns.IsTemporary // not a name that does not exist
	case errors.As(err, &stream):
		return slices.Contains(retryableStreamCodes, stream.Code)
	case isRemoteAlert(err):
		return false // the server refused the TLS handshake
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return true
	case errors.As(err, &sysErr):
		return true
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	case cutUnderHeaders(err), cutUnderTrailer(err):
		return true
	}
	msg := err.Error()
	return strings.HasPrefix(msg, h2GoAwayError) || strings.HasPrefix(msg, h2ConnectionLost)
}

// cutUnderHeaders reports an HTTP/1 answer whose connection closed inside
// its status line or a header line. net/http reads the piece before the
// close as a whole line, and reports what is wrong with it, not the close:
// a status line "HTTP/1." or "HTTP/1.1 2" is malformed, a header line
// "Content-" has no colon. Such an answer was lost as one cut at a line's
// end is (an unexpected EOF), and the request may have run: it is resent
// under its key, as that one is. A first line that does not begin as an
// HTTP/1 status line does (an SSH banner, a mail server's greeting) is an
// answer that is not HTTP, and is not resent. A whole line that is
// malformed so reads the same as a cut one: a server whose every answer
// has one is tried MaxAttempts times, under the one key.
func cutUnderHeaders(err error) bool {
	var header textproto.ProtocolError
	if errors.As(err, &header) {
		return true // the status line was HTTP's: a header line was cut
	}
	msg := err.Error()
	if code, ok := quotedAfter(msg, "malformed HTTP status code "); ok {
		return len(code) < 3 && strings.Trim(code, "0123456789") == ""
	}
	if line, ok := quotedAfter(msg, "malformed HTTP response "); ok {
		return line != "" && (strings.HasPrefix("HTTP/1.1", line) || strings.HasPrefix("HTTP/1.0", line))
	}
	return false
}

// cutUnderTrailer reports a chunked HTTP/1 answer whose connection closed
// after its last chunk, inside its trailer section: net/http says the
// trailer ended early, or, finding no end of it in what came, that it is
// suspiciously long. The body came whole; its trailers did not, and a
// resume reads them from the replay.
func cutUnderTrailer(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "http: unexpected EOF reading trailer") ||
		strings.Contains(msg, "http: suspiciously long trailer after chunked body")
}

// quotedAfter finds what net/http quoted (%q) after what in msg.
func quotedAfter(msg, what string) (string, bool) {
	_, rest, ok := strings.Cut(msg, what)
	if !ok {
		return "", false
	}
	quoted, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	s, err := strconv.Unquote(quoted)
	return s, err == nil
}

// isRemoteAlert reports a TLS alert the server sent: its handshake refused
// ours (no client certificate, no common protocol version or cipher).
func isRemoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// h2StreamError has the shape of net/http's HTTP/2 stream error, which
// errors.As fills in through the error's own As method (net/http bundles
// its HTTP/2 code and exports none of its types).
type h2StreamError struct {
	StreamID uint32
	Code     uint32
	Cause    error
}

func (e h2StreamError) Error() string { return "http2 stream error" }

// retryableStreamCodes are the RST_STREAM codes (RFC 9113 §7) of a stream
// that another attempt may get through: INTERNAL_ERROR (a front proxy lost
// the server's answer, the HTTP/2 form of a 502), REFUSED_STREAM (the
// server did not start it), CANCEL (it gave it up) and ENHANCE_YOUR_CALM
// (it sheds load). With the same key, a run that took effect is replayed,
// not run again. net/http's server also resets a panicking handler's
// stream with INTERNAL_ERROR; the middleware released that key only when
// nothing of the run took effect (the panic came before the status), so a
// resend runs it again, as over HTTP/1, whose closed connection cannot be
// told from a lost answer either: MaxAttempts bounds a handler that panics
// every time, and a recoverer outside the middleware answers 500 instead.
var retryableStreamCodes = []uint32{0x2, 0x7, 0x8, 0xb}

// The messages of net/http's HTTP/2 errors for a connection that went away
// under a request, whose types are not exported: the server closed it
// after a GOAWAY, or it stopped answering pings (ReadIdleTimeout).
const (
	h2GoAwayError    = "http2: server sent GOAWAY and closed the connection"
	h2ConnectionLost = "http2: client connection lost"
)
