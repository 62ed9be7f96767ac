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
// a copy for replay. It records only what the handler itself writes: the
// handler gets a header map of its own, merged into the outer writer's when
// the status goes out, so headers that middleware outside Protect set for
// this request (a request id, CORS, Content-Encoding) are neither stored nor
// replayed to the next caller.
//
// Once a write to the client fails (the client went away, a write deadline
// passed, a timeout handler outside gave up), the recorder goes on recording
// and tells the handler that its writes succeed, so that the stored answer
// is the whole answer and not the part the client happened to receive. A
// handler that streams (Flush, Hijack) or writes more than the limit still
// reaches its client in full; the copy is then dropped and the response
// marked not replayable, and from then on a failed write is reported to the
// handler, so that one that writes until an error stops.
type recorder struct {
	w           http.ResponseWriter
	header      http.Header // the handler's own
	storable    func(string) bool
	limit       int
	status      int
	pairs       []string // the storable headers as sent with the status
	informed    []string // names sent with an informational answer
	body        bytes.Buffer
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
	return &recorder{w: w, header: make(http.Header, 4), limit: limit, storable: storable}
}

func (rw *recorder) Header() http.Header { return rw.header }

func (rw *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// net/http panics on it before anything is sent: the status has
		// not gone out, and a panic now still releases the key.
		rw.w.WriteHeader(code)
		return
	}
	if rw.wroteHeader {
		rw.w.WriteHeader(code) // superfluous: net/http logs it
		return
	}
	informational := code >= 100 && code < 200 && code != http.StatusSwitchingProtocols
	rw.mergeHeader(informational)
	if informational {
		rw.w.WriteHeader(code) // 103 Early Hints and the like; the final answer follows
		return
	}
	rw.wroteHeader = true
	rw.status = code
	rw.declared = declaredLength(rw.header)
	// What is stored is what goes out now: headers set later never reach
	// the client (trailers aside), so they are not replayed either.
	rw.pairs = headerPairs(rw.header, rw.storable)
	if code == http.StatusSwitchingProtocols {
		rw.markPartial() // the connection is the handler's now
	}
	if rw.stamp != nil {
		rw.stamp(code, rw.w.Header())
	}
	rw.w.WriteHeader(code)
}

// mergeHeader copies the handler's headers into the outer writer's, the
// handler's values replacing an outer value of the same name. A header sent
// with an informational answer and deleted since is deleted from the final
// one too.
func (rw *recorder) mergeHeader(informational bool) {
	dst := rw.w.Header()
	for _, name := range rw.informed {
		if _, ok := rw.header[name]; !ok {
			delete(dst, name)
		}
	}
	for name, values := range rw.header {
		dst[name] = values
		if informational {
			rw.informed = append(rw.informed, name)
		}
	}
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rw.status) {
		return rw.w.Write(p) // net/http refuses it (ErrBodyNotAllowed); nothing to record
	}
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
	switch {
	case err == nil:
	case errors.Is(err, http.ErrContentLength):
		// The handler wrote past its own Content-Length: a handler bug,
		// not a departed client. net/http sent nothing of p, so the
		// record must not hold it either.
		rw.body.Truncate(max(rw.body.Len()-len(p), 0))
	default:
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
// replayable.
func (rw *recorder) Flush() {
	rw.FlushError()
}

// FlushError is what http.ResponseController calls; see Flush.
func (rw *recorder) FlushError() error {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	rw.markPartial()
	return http.NewResponseController(rw.w).Flush()
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

// finish sends the headers of a handler that returned without writing, as
// net/http would have sent them with an implicit 200, passes on trailers,
// and returns the response to store, or nil when it cannot be replayed.
// Trailers are not stored: a replay is sent in one piece.
func (rw *recorder) finish() *record {
	if !rw.wroteHeader {
		rw.silent = true
		rw.WriteHeader(http.StatusOK)
	}
	rw.passTrailers()
	if !rw.partial && !rw.head && rw.declared >= 0 && bodyAllowed(rw.status) && int64(rw.body.Len()) != rw.declared {
		// The handler stopped short of the length it declared: net/http
		// closes the connection, and the client knows its answer is cut
		// short. A replay of what was written would look complete.
		rw.markPartial()
	}
	if rw.partial {
		return nil
	}
	rec := newRecord(rw.status, rw.pairs, rw.body.Bytes())
	rec.filtered = true
	return rec
}

// passTrailers copies the trailers the handler set after the status into
// the outer writer's headers, where net/http looks for them: those
// declared in a Trailer header, and those named with http.TrailerPrefix.
func (rw *recorder) passTrailers() {
	dst := rw.w.Header()
	for name, values := range rw.header {
		if strings.HasPrefix(name, http.TrailerPrefix) {
			dst[name] = values
		}
	}
	for _, declared := range rw.header["Trailer"] {
		for _, name := range strings.Split(declared, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if values, ok := rw.header[name]; ok {
				dst[name] = values
			}
		}
	}
}

// headerPairs flattens the storable headers into name, value, … pairs.
// A name the handler set without canonicalising it (h["ETag"]) is kept as
// written, as net/http sends it, and judged by its canonical form: the
// policy's names are canonical, and "set-cookie" is Set-Cookie.
func headerPairs(h http.Header, storable func(string) bool) []string {
	n := 0
	for _, values := range h {
		n += 2 * len(values)
	}
	pairs := make([]string, 0, n)
	for name, values := range h {
		if storable(http.CanonicalHeaderKey(name)) {
			for _, v := range values {
				pairs = append(pairs, name, v)
			}
		}
	}
	return pairs
}
