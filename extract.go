package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
)

// A KeyExtractor finds the idempotency key, or the issued token, in a
// request. body is the request body, already read in full (the handler still
// gets its own copy). It returns "" and a nil error when the request carries
// no key; an error rejects the request with the invalid-key problem.
type KeyExtractor func(r *http.Request, body []byte) (string, error)

// HeaderKey reads the key from a request header, such as "Idempotency-Key"
// or "X-GitHub-Delivery". A value in double quotes is read as the IETF
// draft defines Idempotency-Key, a Structured Field string ("abc", with \"
// and \\ escapes, parameters after it ignored), so "abc" and abc are one
// key; a malformed one is an error.
func HeaderKey(name string) KeyExtractor {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ []byte) (string, error) {
		values := r.Header[name]
		if len(values) > 1 {
			return "", errors.New("idempotency: key header repeated")
		}
		if len(values) == 0 {
			return "", nil
		}
		key, err := structuredString(values[0])
		if err == nil && key == "" {
			// Present but empty is a client bug, not "no key": it must not
			// pass as a request without one (WithOptionalKey).
			err = errors.New("idempotency: empty key")
		}
		return key, err
	}
}

var errMalformedString = errors.New("idempotency: malformed structured field string")

// structuredString reads an RFC 8941 string when v is quoted, and returns v
// as it is otherwise. github.com/dunglas/httpsfv parses every structured
// field type; one type of twenty lines does not earn a dependency of the
// root module.
func structuredString(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch ch := v[i]; {
		case ch == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errMalformedString
			}
			b.WriteByte(v[i])
		case ch == '"':
			if rest := v[i+1:]; rest != "" && rest[0] != ';' {
				return "", errMalformedString
			}
			return b.String(), nil
		case ch < 0x20 || ch > 0x7e:
			return "", errMalformedString
		default:
			b.WriteByte(ch)
		}
	}
	return "", errMalformedString // no closing quote
}

// FormKey reads the key from a field of a URL-encoded or multipart form body,
// or from the parsed form when middleware outside the protection parsed it
// already.
func FormKey(field string) KeyExtractor {
	return func(r *http.Request, body []byte) (string, error) {
		if formParsed(r) {
			return r.PostForm.Get(field), nil
		}
		mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil {
			return "", nil
		}
		switch mediaType {
		case "application/x-www-form-urlencoded":
			values, err := url.ParseQuery(string(body))
			if err != nil {
				return "", err
			}
			return values.Get(field), nil
		case "multipart/form-data":
			return multipartField(body, params["boundary"], field)
		}
		return "", nil
	}
}

// multipartKeyLimit bounds how much of a multipart field is read; a key is
// never longer.
const multipartKeyLimit = 4096

func multipartField(body []byte, boundary, field string) (string, error) {
	if boundary == "" {
		return "", errors.New("idempotency: multipart body without boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if part.FormName() == field && part.FileName() == "" {
			value, err := io.ReadAll(io.LimitReader(part, multipartKeyLimit+1))
			return string(value), err
		}
	}
}

// JSONKey reads the key from a string or number field of a JSON object body.
// path names nested objects with dots: "event.id". A body that is not a JSON
// object carries no key.
func JSONKey(path string) KeyExtractor {
	steps := strings.Split(path, ".")
	return func(_ *http.Request, body []byte) (string, error) {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return "", nil
		}
		v, _ = jsonAt(v, steps) // absent reads as null: no key
		switch v := v.(type) {
		case string:
			return v, nil
		case json.Number:
			return v.String(), nil
		case nil:
			return "", nil
		}
		return "", errors.New("idempotency: JSON key is neither a string nor a number")
	}
}

// FirstKey tries extractors in order and returns the first key found.
func FirstKey(extractors ...KeyExtractor) KeyExtractor {
	return func(r *http.Request, body []byte) (string, error) {
		for _, e := range extractors {
			if key, err := e(r, body); key != "" || err != nil {
				return key, err
			}
		}
		return "", nil
	}
}

// validKey accepts printable ASCII up to max bytes: everything else, CR and
// LF above all, is refused before it reaches Redis or a log line.
func validKey(key string, max int) bool {
	if len(key) == 0 || len(key) > max {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}
