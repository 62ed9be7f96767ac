package idempotency

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strconv"
)

// readBody reads the whole request body, which the fingerprint needs before
// anything runs, and puts it back through br for the extractor and the
// handler. A form that middleware outside us already parsed has left no
// body to read: the parsed form stands for it, together with whatever that
// parse left unread. Either way the body is held to limit.
func readBody(r *http.Request, limit int64, br *bodyReader) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, ErrRequestTooLarge
	}
	parsed := formParsed(r)
	var form []byte
	if parsed {
		var err error
		if form, err = encodeParsedForm(r); err != nil {
			return nil, err
		}
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		if body, err = readAll(r.Body, r.ContentLength, limit); err != nil {
			return nil, err
		}
		br.Reset(body)
		r.Body = br
	}
	switch {
	case !parsed:
		return body, nil
	case len(body) > 0:
		return appendParts(form, "rest", string(body)), nil
	}
	return form, nil
}

// firstRead is how much readAll sets aside before a byte arrived: what the
// server reads from a connection at once.
const firstRead = 4 << 10

// readAll reads r to its end, refusing more than limit bytes. Its buffer
// grows with what arrives, not with what the request declared (declared,
// -1 when unknown): a client that promises a large body and sends nothing
// more costs only firstRead. A body within firstRead is read into one
// buffer of its size.
func readAll(r io.Reader, declared, limit int64) ([]byte, error) {
	ceiling := limit + 1 // enough to tell a body over the limit
	if ceiling <= 0 {
		ceiling = math.MaxInt64
	}
	size := int64(bytes.MinRead)
	if declared >= 0 {
		size = min(declared, firstRead) + 1 // +1 to see the end without growing
	}
	b := make([]byte, 0, min(size, ceiling))
	for {
		if len(b) == cap(b) {
			grown := 2 * int64(cap(b))
			if declared >= int64(cap(b)) { // the last step ends at the declared end
				grown = min(grown, declared+1)
			}
			b = slices.Grow(b, int(min(grown, ceiling))-len(b))
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return nil, ErrRequestTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			// A limit set outside us (http.MaxBytesHandler) is the same
			// refusal as our own.
			return nil, ErrRequestTooLarge
		}
		if err != nil {
			return nil, ErrUnreadableBody
		}
	}
}

// bodyReader is the request body as the handler sees it: the bytes the
// middleware read, from the start.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// formParsed reports whether middleware outside us (CSRF protection, a
// method override) parsed the request's form from its body, consuming it.
// net/http reads a URL-encoded body for POST, PUT and PATCH only: for any
// other method r.ParseForm leaves r.PostForm an empty map and the body
// unread. A filled PostForm was read from the body whatever the method
// says now (a method override changes it after reading the form).
func formParsed(r *http.Request) bool {
	if r.PostForm == nil && r.MultipartForm == nil {
		return false // the common case, decided without parsing a header
	}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mediaType {
	case "application/x-www-form-urlencoded":
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			return r.PostForm != nil
		}
		return len(r.PostForm) > 0
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
