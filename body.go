package idempotency

import (
	"bytes"
	"io"
	"net/http"
)

// readBody reads the whole request body, which the fingerprint needs before
// anything runs, and puts it back through br for the extractor and the
// handler.
func readBody(r *http.Request, limit int64, br *bodyReader) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, ErrRequestTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var body []byte
	if r.ContentLength > 0 {
		body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, ErrUnreadableBody
		}
	} else {
		var buf bytes.Buffer
		n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
		if err != nil {
			return nil, ErrUnreadableBody
		}
		if n > limit {
			return nil, ErrRequestTooLarge
		}
		body = buf.Bytes()
	}
	br.Reset(body)
	r.Body = br
	return body, nil
}

// bodyReader is the request body as the handler sees it: the bytes the
// middleware read, from the start.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }
