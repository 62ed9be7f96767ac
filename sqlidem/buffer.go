package sqlidem

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/onceonly/idempotency"
)

// buffer holds a TxFunc's answer until its transaction commits. It keeps
// up to limit bytes of body in memory, which is all that may be committed
// for replay; past that the answer is not replayable, and the rest waits
// in a temporary file, so that a large answer costs disk, not memory,
// until it is sent.
type buffer struct {
	header http.Header
	status int
	body   bytes.Buffer // the first limit bytes
	limit  int
	spill  *os.File // the rest; nil until the body passes limit
	over   bool     // the body passed limit
}

func newBuffer(limit int) *buffer { return &buffer{header: make(http.Header), limit: limit} }

func (b *buffer) Header() http.Header { return b.header }

// WriteHeader keeps the first final status; informational ones (1xx) are
// not held back for later, they are dropped.
func (b *buffer) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// As net/http does with such a code, before anything is held or
		// committed: the transaction rolls back, and the key is released.
		panic(fmt.Sprintf("sqlidem: invalid WriteHeader code %v", code))
	}
	if b.status == 0 && code >= 200 {
		b.status = code
	}
}

func (b *buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	if !b.over && b.body.Len()+len(p) <= b.limit {
		return b.body.Write(p)
	}
	b.over = true
	if b.spill == nil {
		f, err := os.CreateTemp("", "sqlidem-answer-")
		if err != nil {
			// No room for a file: held in memory after all.
			return b.body.Write(p)
		}
		os.Remove(f.Name()) // gone with the last descriptor, also after a crash (on Unix)
		b.spill = f
	}
	return b.spill.Write(p)
}

// code is the status the answer goes out with.
func (b *buffer) code() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

// answer is what commits with the transaction: the whole answer, or,
// over the limit, its status alone, marked not replayable.
func (b *buffer) answer() idempotency.Answer {
	if b.over {
		return idempotency.Answer{Status: b.code(), NotReplayable: true}
	}
	return idempotency.Answer{Status: b.code(), Header: b.stored(), Body: b.body.Bytes()}
}

// writeTo sends the held answer.
func (b *buffer) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for name, values := range b.header {
		h[name] = values
	}
	w.WriteHeader(b.code())
	w.Write(b.body.Bytes())
	if b.spill != nil {
		if _, err := b.spill.Seek(0, io.SeekStart); err == nil {
			io.Copy(w, b.spill)
		}
	}
}

// close lets go of the temporary file, if any.
func (b *buffer) close() {
	if b != nil && b.spill != nil {
		b.spill.Close()
		os.Remove(b.spill.Name())
		b.spill = nil
	}
}

// stored is the part of the answer's header that is committed for
// replay: a cookie set for one client, and what is computed per response,
// are not.
func (b *buffer) stored() http.Header {
	h := make(http.Header, len(b.header))
	for name, values := range b.header {
		switch http.CanonicalHeaderKey(name) {
		case "Set-Cookie", "Date", "Content-Length", "Connection", "Transfer-Encoding", idempotency.ReplayedHeader:
			continue
		}
		h[name] = values
	}
	return h
}
