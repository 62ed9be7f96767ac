package idempotency

import (
	"bytes"
	"crypto/sha256"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
)

// readBody reads the whole request body, which the fingerprint needs before
// anything runs, and puts it back through br for the extractor and the
// handler. A form that middleware outside us already parsed has no body
// left to read: the parsed form stands for it.
func readBody(r *http.Request, limit int64, br *bodyReader) ([]byte, error) {
	if formParsed(r) {
		return encodeParsedForm(r)
	}
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

// formParsed reports whether middleware outside us (CSRF protection, a
// method override) parsed the request's form from its body, consuming it.
func formParsed(r *http.Request) bool {
	if r.PostForm == nil && r.MultipartForm == nil {
		return false // the common case, decided without parsing a header
	}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mediaType {
	case "application/x-www-form-urlencoded":
		return r.PostForm != nil
	case "multipart/form-data":
		return r.MultipartForm != nil
	}
	return false
}

// encodeParsedForm writes a parsed form in one canonical order, for the
// fingerprint: its fields sorted by name (url.Values.Encode), then each
// file's field, name, size and content digest.
func encodeParsedForm(r *http.Request) ([]byte, error) {
	b := []byte(r.PostForm.Encode())
	if r.MultipartForm == nil {
		return b, nil
	}
	fields := make([]string, 0, len(r.MultipartForm.File))
	for name := range r.MultipartForm.File {
		fields = append(fields, name)
	}
	slices.Sort(fields)
	for _, field := range fields {
		for _, fh := range r.MultipartForm.File[field] {
			f, err := fh.Open()
			if err != nil {
				return nil, ErrUnreadableBody
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return nil, ErrUnreadableBody
			}
			b = appendParts(b, "file", field, fh.Filename, strconv.FormatInt(fh.Size, 10), string(h.Sum(nil)))
		}
	}
	return b, nil
}
