package idempotency

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// recorder passes a handler's response through to the client while keeping
// a copy for replay. The handler writes into the outer writer's own header
// map, so what goes out on the first answer is exactly what the same stack
// without the middleware sends: the handler's Add joins what outer layers
// set (a session's refreshed cookie, a CORS layer's Vary), its Set replaces
// it. What is recorded is the handler's part alone, found by comparing the
// map with what the outer layers had set when the handler started: headers
// that middleware outside Protect set for this request (a request id,
// CORS, Content-Encoding) are neither stored nor replayed to the next
// caller.
//
// Once a write to the client fails (the client went away, a write deadline
// passed, a timeout handler outside gave up), the recorder goes on recording
// and tells the handler that its writes succeed, so that the stored answer
// is the whole answer and not the part the client happened to receive. A
// handler that streams (a Flush that flushed, a Hijack) or writes more than
// the limit still reaches its client in full; the copy is then dropped and
// the response marked not replayable, and from then on a failed write is
// reported to the handler, so that one that writes until an error stops.
type recorder struct {
	w        http.ResponseWriter
	header   http.Header // w's, which the handler shares
	before   http.Header // what outer layers had set when the handler started; nil for nothing
	request  http.Header // the request's, for the values its answer varies on
	storable func(string) bool
	limit    int
	status   int
	pairs    []string // the storable headers as sent with the status
	trailers []string // the names the handler declared in a Trailer header
	body     bytes.Buffer
	written  int64 // body bytes the handler wrote

	wroteHeader bool
	partial     bool  // streamed, hijacked, switched protocols or over the limit
	silent      bool  // the handler returned without writing anything
	head        bool  // a HEAD request: a declared length comes with no body
	declared    int64 // the Content-Length the handler sent, or -1
	writeErr    error // the first failed write to the client
	// stamp adds the middleware's own headers to the outer writer's when
	// the status goes out; they are not the handler's, so not recorded.
	stamp func(status int, h http.Header)
}

func newRecorder(w http.ResponseWriter, limit int, storable func(string) bool) *recorder {
	h := w.Header()
	return &recorder{w: w, header: h, before: snapshot(h), limit: limit, storable: storable}
}

// snapshot is a shallow copy of h: the handler's Add appends past the end
// of a copied slice, and its Set replaces the slice, so both show against
// it. Nothing is copied when the outer layers set nothing.
func snapshot(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	c := make(http.Header, len(h))
	for name, values := range h {
		c[name] = values[:len(values):len(values)]
	}
	return c
}

// own is what the handler set of name's values: those past what the outer
// layers had set when they are still there in front, otherwise all of them
// (the handler replaced them).
func (rw *recorder) own(name string, values []string) []string {
	outer, ok := rw.before[name]
	if !ok || len(outer) > len(values) {
		return values
	}
	for i := range outer {
		if outer[i] != values[i] {
			return values
		}
	}
	return values[len(outer):]
}

func (rw *recorder) Header() http.Header { return rw.header }

func (rw *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// net/http panics on it before anything is sent: the status has
		// not gone out, and a panic now still releases the key.
		rw.w.WriteHeader(code)
		return
	}
	if rw.wroteHeader || code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Superfluous (net/http logs it), or 103 Early Hints and the like,
		// whose headers go out as the handler left them; the final answer
		// follows.
		rw.w.WriteHeader(code)
		return
	}
	rw.wroteHeader = true
	rw.status = code
	rw.declared = declaredLength(rw.header)
	// What is stored is what goes out now: headers set later never reach
	// the client (trailers aside), so they are not replayed either.
	rw.pairs = rw.ownPairs()
	if code == http.StatusSwitchingProtocols {
		rw.markPartial() // the connection is the handler's now
	}
	if rw.stamp != nil {
		rw.stamp(code, rw.header)
	}
	rw.w.WriteHeader(code)
}

// ownPairs flattens the handler's storable headers into name, value, …
// pairs, the names it declared as trailers aside, with the request's
// values of the headers its Vary names. A name the handler set without
// canonicalising it (h["ETag"]) is kept as written, as net/http sends it,
// and judged by its canonical form: the policy's names are canonical, and
// "set-cookie" is Set-Cookie.
func (rw *recorder) ownPairs() []string {
	n := 0
	for _, values := range rw.header {
		n += 2 * len(values)
	}
	pairs := make([]string, 0, n)
	for name, values := range rw.header {
		values = rw.own(name, values)
		canonical := http.CanonicalHeaderKey(name)
		switch {
		case len(values) == 0 || strings.HasPrefix(name, http.TrailerPrefix):
		case canonical == "Trailer":
			rw.trailers = values
		case canonical == "Vary":
			if rw.storable(canonical) {
				pairs = appendValues(pairs, name, values)
				pairs = appendVaried(pairs, values, rw.request)
			}
		case rw.storable(canonical):
			pairs = appendValues(pairs, name, values)
		}
	}
	return pairs
}

func appendValues(pairs []string, name string, values []string) []string {
	for _, v := range values {
		pairs = append(pairs, name, v)
	}
	return pairs
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rw.status) {
		return rw.w.Write(p) // net/http refuses it (ErrBodyNotAllowed); nothing to record
	}
	if rw.declared >= 0 && !rw.head && rw.written+int64(len(p)) > rw.declared {
		// The handler writes past its own Content-Length: a handler bug,
		// not a departed client. HTTP/1 refuses such a write whole
		// (ErrContentLength); HTTP/2 buffers it and the client then reads
		// a broken answer. Refused here on every protocol, as HTTP/1
		// does, the answer is what was written up to the length, on the
		// first answer and on its replays.
		return 0, http.ErrContentLength
	}
	rw.written += int64(len(p))
	if !rw.partial {
		if rw.body.Len()+len(p) > rw.limit {
			rw.markPartial()
		} else {
			rw.body.Write(p)
		}
	}
	if rw.writeErr != nil {
		if rw.partial {
			return 0, rw.writeErr
		}
		return len(p), nil
	}
	n, err := rw.w.Write(p)
	if err != nil {
		rw.writeErr = err
		if !rw.partial {
			return len(p), nil // recorded in full; the retry gets it all
		}
	}
	return n, err
}

// declaredLength is the Content-Length a handler set, or -1.
func declaredLength(h http.Header) int64 {
	v := h["Content-Length"]
	if len(v) != 1 {
		return -1
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// bodyAllowed reports whether a status may carry a body (RFC 9110).
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status > 199)
}

func (rw *recorder) markPartial() {
	rw.partial = true
	rw.body = bytes.Buffer{}
}

// Flush streams what was written so far; the response stops being
// replayable. Where the outer writer cannot flush (under
// http.TimeoutHandler, which holds the answer until the handler returns),
// nothing is streamed and the response stays replayable.
func (rw *recorder) Flush() {
	rw.FlushError()
}

// FlushError is what http.ResponseController calls; see Flush.
func (rw *recorder) FlushError() error {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	err := http.NewResponseController(rw.w).Flush()
	if !errors.Is(err, http.ErrNotSupported) {
		rw.markPartial()
	}
	return err
}

// Hijack hands the connection to the handler; the response stops being
// replayable.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, buf, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.markPartial()
		rw.wroteHeader = true
	}
	return conn, buf, err
}

// Unwrap lets http.ResponseController reach the underlying writer for
// deadlines and other extensions.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// adopt answers with rec, an answer the key already has (an outcome
// store's committed one), as a replay through rec.write, and keeps it as
// the answer to store. err, when set, is what this client gets instead
// (rec cannot be served under its negotiation); rec is still the key's.
func (rw *recorder) adopt(r *http.Request, rec *record, decode bool, cfg *config, err error) {
	if err != nil {
		cfg.errorHandler(rw.w, r, err)
	} else {
		rec.write(rw.w, r, cfg, decode)
	}
	rw.wroteHeader, rw.status, rw.pairs = true, rec.status, rec.header
	rw.declared, rw.trailers = -1, nil
	rw.body.Reset()
	rw.body.Write(rec.body)
}

// finish sends the headers of a handler that returned without writing, as
// net/http would have sent them with an implicit 200, and returns the
// response to store, or nil when it cannot be replayed.
func (rw *recorder) finish() *record {
	if !rw.wroteHeader {
		rw.silent = true
		rw.WriteHeader(http.StatusOK)
	}
	if !rw.partial && !rw.head && rw.declared >= 0 && bodyAllowed(rw.status) && rw.written != rw.declared {
		// The handler stopped short of the length it declared: net/http
		// closes the connection, and the client knows its answer is cut
		// short. A replay of what was written would look complete.
		rw.markPartial()
	}
	if rw.partial {
		return nil
	}
	rec := newRecord(rw.status, rw.appendTrailers(rw.pairs), rw.body.Bytes())
	rec.filtered = true
	return rec
}

// appendTrailers appends the trailers the handler sent, under their
// http.TrailerPrefix names: those it declared in a Trailer header and set
// after the status, and those it set under the prefix.
func (rw *recorder) appendTrailers(pairs []string) []string {
	for _, declared := range rw.trailers {
		for _, name := range strings.Split(declared, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if values := rw.header[name]; len(values) > 0 && rw.storable(name) {
				pairs = appendValues(pairs, http.TrailerPrefix+name, values)
			}
		}
	}
	for name, values := range rw.header {
		if trailer, ok := strings.CutPrefix(name, http.TrailerPrefix); ok && rw.storable(http.CanonicalHeaderKey(trailer)) {
			pairs = appendValues(pairs, http.TrailerPrefix+http.CanonicalHeaderKey(trailer), rw.own(name, values))
		}
	}
	return pairs
}
