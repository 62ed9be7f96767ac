package sqlidem

import (
	"bytes"
	"net/http"

	"github.com/onceonly/idempotency"
)

// buffer holds a TxFunc's answer until its transaction commits.
type buffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newBuffer() *buffer { return &buffer{header: make(http.Header)} }

func (b *buffer) Header() http.Header { return b.header }

// WriteHeader keeps the first final status; informational ones (1xx) are
// not held back for later, they are dropped.
func (b *buffer) WriteHeader(code int) {
	if b.status == 0 && code >= 200 {
		b.status = code
	}
}

func (b *buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// code is the status the answer goes out with.
func (b *buffer) code() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

// writeTo sends the held answer.
func (b *buffer) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for name, values := range b.header {
		h[name] = values
	}
	w.WriteHeader(b.code())
	w.Write(b.body.Bytes())
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
