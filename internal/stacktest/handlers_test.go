package stacktest

import (
	"io"
	"net/http"
	"strings"
)

// What a duplicate of a handler's request is expected to get.
type expect int

const (
	replayed      expect = iota // the first answer, under its own negotiation, plus the marker
	notReplayable               // 409 not-replayable
	passed                      // an unprotected method: the handler runs again
)

// A handlerCase is a handler and what its duplicates get.
type handlerCase struct {
	name   string
	method string
	serve  http.HandlerFunc
	dup    expect
	// streams: the handler flushes, so its answer is replayed only where
	// the writer it was given cannot flush.
	streams bool
	// overruns: it writes past its own Content-Length, which HTTP/2
	// without the middleware sends as a broken answer, and the
	// middleware refuses as HTTP/1 does.
	overruns bool
}

// payment is a body larger than the compressors' thresholds.
var payment = `{"payment":"` + strings.Repeat("paid ", 400) + `"}`

// limit is the stacks' WithMaxResponseBytes.
const limit = 4 << 10

var handlers = []handlerCase{
	{name: "plain", method: http.MethodPost, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/1")
		w.Header().Add("Vary", "Accept")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, payment)
	}},
	{name: "streaming", method: http.MethodPost, dup: notReplayable, streams: true, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "part one\n")
		http.NewResponseController(w).Flush()
		io.WriteString(w, "part two\n")
	}},
	{name: "flush if you can", method: http.MethodPost, dup: notReplayable, streams: true, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "part one\n")
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		io.WriteString(w, "part two\n")
	}},
	{name: "trailers", method: http.MethodPost, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Trailer", "Content-Digest")
		io.WriteString(w, "hello")
		w.Header().Set("Content-Digest", "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:")
	}},
	{name: "103 then 201", method: http.MethodPost, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, payment)
	}},
	{name: "HEAD", method: http.MethodHead, dup: passed, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1234")
	}},
	{name: "304", method: http.MethodPost, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		w.WriteHeader(http.StatusNotModified)
	}},
	{name: "Content-Length too large", method: http.MethodPost, dup: notReplayable, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "short")
	}},
	{name: "Content-Length too small", method: http.MethodPost, overruns: true, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		io.WriteString(w, "hello")
		io.WriteString(w, " world")
	}},
	{name: "larger than the limit", method: http.MethodPost, dup: notReplayable, serve: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, strings.Repeat("x", 2*limit))
	}},
}
