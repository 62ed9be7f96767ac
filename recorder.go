package idempotency

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
)

// recorder passes a handler's response through to the client while keeping
// a copy for replay. A handler that streams (Flush, Hijack) or writes more
// than the limit still reaches its client in full; the copy is then dropped
// and the response marked not replayable, so no duplicate ever sees part of
// a body.
type recorder struct {
	w           http.ResponseWriter
	cfg         *config
	status      int
	header      []string
	body        bytes.Buffer
	wroteHeader bool
	partial     bool // streamed, hijacked or over the limit
}

func newRecorder(w http.ResponseWriter, cfg *config) *recorder {
	return &recorder{w: w, cfg: cfg}
}

func (rw *recorder) Header() http.Header { return rw.w.Header() }

func (rw *recorder) WriteHeader(code int) {
	if rw.wroteHeader || (code >= 100 && code < 200 && code != http.StatusSwitchingProtocols) {
		// Informational answers and superfluous calls pass through untouched;
		// net/http logs the latter.
		rw.w.WriteHeader(code)
		return
	}
	rw.wroteHeader = true
	rw.status = code
	for name, values := range rw.w.Header() {
		if rw.cfg.storable(name) {
			for _, v := range values {
				rw.header = append(rw.header, name, v)
			}
		}
	}
	rw.w.WriteHeader(code)
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if !rw.partial {
		if rw.body.Len()+len(p) > rw.cfg.maxResponse {
			rw.markPartial()
		} else {
			rw.body.Write(p)
		}
	}
	return rw.w.Write(p)
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

// result is the response to store, or nil when it cannot be replayed.
func (rw *recorder) result() *record {
	if rw.partial {
		return nil
	}
	status := rw.status
	if !rw.wroteHeader {
		status = http.StatusOK // net/http's answer to a handler that wrote nothing
	}
	return newRecord(status, rw.header, rw.body.Bytes())
}
