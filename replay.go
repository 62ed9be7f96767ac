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

// ReplayedHeader marks a response that was replayed from a stored record.
const ReplayedHeader = "Idempotent-Replayed"

// A record is a completed response as stored for replay. It never changes
// once stored.
type record struct {
	status int
	header http.Header
	body   []byte
}

// write replays rec to w.
func (rec *record) write(w http.ResponseWriter) {
	h := w.Header()
	for name, values := range rec.header {
		h[name] = append([]string(nil), values...)
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(rec.body)))
	w.WriteHeader(rec.status)
	w.Write(rec.body)
}

// hopByHop headers describe one connection and never belong in a replay.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// Recomputed for every response.
	"Content-Length": true, "Date": true,
}

// storable reports whether a response header is kept for replay.
func (c *config) storable(name string) bool {
	if c.replayHeaders != nil {
		return c.replayHeaders[name]
	}
	return name != "Set-Cookie" && !hopByHop[name]
}

// recorder passes a handler's response through to the client while keeping
// a copy for replay. A handler that streams (Flush, Hijack) or writes more
// than the limit still reaches its client in full; the copy is then dropped
// and the response marked not replayable, so no duplicate ever sees part of
// a body.
type recorder struct {
	w           http.ResponseWriter
	cfg         *config
	status      int
	header      http.Header
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
	rw.header = make(http.Header, len(rw.w.Header()))
	for name, values := range rw.w.Header() {
		if rw.cfg.storable(name) {
			rw.header[name] = append([]string(nil), values...)
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
	return &record{status: status, header: rw.header, body: rw.body.Bytes()}
}

// encodeHeader writes a header as "Name: value" lines. HTTP forbids CR and
// LF in names and values, so a newline never occurs inside one.
func encodeHeader(h http.Header) string {
	var b strings.Builder
	for name, values := range h {
		for _, v := range values {
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

var errCorruptHeader = errors.New("idempotency: corrupt stored header")

func decodeHeader(s string) (http.Header, error) {
	h := make(http.Header)
	for s != "" {
		line, rest, ok := strings.Cut(s, "\n")
		if !ok {
			return nil, errCorruptHeader
		}
		name, value, ok := strings.Cut(line, ": ")
		if !ok || name == "" {
			return nil, errCorruptHeader
		}
		h[name] = append(h[name], value)
		s = rest
	}
	return h, nil
}
