package idempotency

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
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
	limit       int
	status      int
	body        bytes.Buffer
	wroteHeader bool
	partial     bool  // streamed, hijacked or over the limit
	writeErr    error // the first failed write to the client
}

func newRecorder(w http.ResponseWriter, limit int) *recorder {
	return &recorder{w: w, header: make(http.Header, 4), limit: limit}
}

func (rw *recorder) Header() http.Header { return rw.header }

func (rw *recorder) WriteHeader(code int) {
	if rw.wroteHeader {
		rw.w.WriteHeader(code) // superfluous: net/http logs it
		return
	}
	rw.mergeHeader()
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		rw.w.WriteHeader(code) // an informational answer; the final one follows
		return
	}
	rw.wroteHeader = true
	rw.status = code
	rw.w.WriteHeader(code)
}

// mergeHeader copies the handler's headers into the outer writer's, the
// handler's values replacing an outer value of the same name.
func (rw *recorder) mergeHeader() {
	dst := rw.w.Header()
	for name, values := range rw.header {
		dst[name] = values
	}
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
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
	if err != nil {
		rw.writeErr = err
		if !rw.partial {
			return len(p), nil // recorded in full; the retry gets it all
		}
	}
	return n, err
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
	rw.markPartial()
	rw.wroteHeader = true
	return http.NewResponseController(rw.w).Hijack()
}

// Unwrap lets http.ResponseController reach the underlying writer for
// deadlines and other extensions.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// finish sends the headers of a handler that returned without writing, as
// net/http would have sent them with an implicit 200, and returns the
// response to store, or nil when it cannot be replayed.
func (rw *recorder) finish(storable func(string) bool) *record {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.partial {
		return nil
	}
	return newRecord(rw.status, headerPairs(rw.header, storable), rw.body.Bytes())
}

// headerPairs flattens the storable headers into name, value, … pairs.
func headerPairs(h http.Header, storable func(string) bool) []string {
	n := 0
	for _, values := range h {
		n += 2 * len(values)
	}
	pairs := make([]string, 0, n)
	for name, values := range h {
		if storable(name) {
			for _, v := range values {
				pairs = append(pairs, name, v)
			}
		}
	}
	return pairs
}
