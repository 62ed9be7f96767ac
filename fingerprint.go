package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/onceonly/idempotency/internal/route"
)

// fingerprintSum identifies what a request asks for. A key presented again
// with another fingerprint is a client bug (or an attack), never a retry, so
// it is refused rather than replayed.
type fingerprintSum [sha256.Size]byte

// text is the fingerprint as the scripts store it in a record, where a
// space or a newline ends a field: in hex.
func (f *fingerprintSum) text() string {
	var b [2 * sha256.Size]byte
	hex.Encode(b[:], f[:])
	return string(b[:])
}

// A Fingerprinter writes what makes a request the request it is, for the
// fingerprint: two requests with one key are the same request when their
// fingerprints are equal. body is the request body as read. The result is
// hashed; separate the parts unambiguously (the ready-made ones do).
// DefaultFingerprint, CanonicalJSON, JSONFields and CanonicalQuery are
// ready-made, and IncludeHeaders adds headers to any of them.
type Fingerprinter func(r *http.Request, body []byte) []byte

// DefaultFingerprint is the method, the path, the raw query and a digest of
// the raw body: a retry must send the same bytes. A multipart body (a form
// with enctype="multipart/form-data") counts by its parts, each with its
// headers, and not by the boundary between them, which a browser draws
// anew for every submission. It is what the middleware uses without
// WithFingerprint (computed there without allocating, but for a multipart
// body). The path, here and in the other ready-made fingerprints, is the
// one the client sent, before http.StripPrefix or a router rewrote
// r.URL.Path.
func DefaultFingerprint(r *http.Request, body []byte) []byte {
	return appendDefault(nil, r, body)
}

// appendDefault appends the default fingerprint's material. Neither a
// client's path nor a method holds a NUL, and the body's digest has a fixed
// length, so the parts cannot run into each other; a multipart body's
// digest is followed by a mark, so that no raw body's material ends as a
// multipart body's does (and a raw body's material is what it was before
// multipart bodies had digests of their own).
func appendDefault(b []byte, r *http.Request, body []byte) []byte {
	bodySum, parts := multipartDigest(r.Header.Get("Content-Type"), body)
	if !parts {
		bodySum = sha256.Sum256(body)
	}
	b = append(b, r.Method...)
	b = append(b, 0)
	b = append(b, route.Path(r)...)
	b = append(b, 0)
	b = append(b, r.URL.RawQuery...)
	b = append(b, 0)
	b = append(b, bodySum[:]...)
	if parts {
		b = append(b, 'm')
	}
	return b
}

// multipartDigest is the digest of a multipart body with its boundary left
// out: for each part, its headers in canonical order and its bytes as sent,
// each written with its length. The preamble and the epilogue, which no
// form parser reads, do not count. It reports false for any other content
// type, and for a body that does not parse as multipart with its declared
// boundary: that counts as its raw bytes.
func multipartDigest(contentType string, body []byte) (fingerprintSum, bool) {
	if len(contentType) < len("multipart/") || !strings.EqualFold(contentType[:len("multipart/")], "multipart/") {
		return fingerprintSum{}, false // the common case: nothing parsed, nothing allocated
	}
	return partsDigest(contentType, body)
}

// partsDigest is multipartDigest past its first look at the content type,
// apart so that the common case allocates nothing.
func partsDigest(contentType string, body []byte) (sum fingerprintSum, ok bool) {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil || params["boundary"] == "" {
		return sum, false
	}
	h := sha256.New()
	h.Write(appendParts(nil, "multipart", mediaType))
	parts := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		part, err := parts.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return sum, false
		}
		names := make([]string, 0, len(part.Header))
		for name := range part.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		material := appendParts(nil, "part", strings.Join(names, "\x00"))
		for _, name := range names {
			material = appendParts(material, strings.Join(part.Header[name], "\x00"))
		}
		content := sha256.New()
		if _, err := io.Copy(content, part); err != nil {
			return sum, false
		}
		h.Write(content.Sum(material))
	}
	h.Sum(sum[:0])
	return sum, true
}

// CanonicalJSON is the method, the path, the query in canonical order and
// the body as canonical JSON, so that a retry that serializes its JSON with
// other member order, spacing or number spelling is the same request. As in
// RFC 8785, members are sorted and whitespace dropped; unlike it, numbers
// compare by their exact value, not as doubles, so two ids beyond 2^53
// never pass for one. Names that a Go decoder may take for one another
// ("amount" and "Amount", or one name repeated) keep their order, which
// decides what the handler decodes. A body that is not JSON counts as it
// is.
func CanonicalJSON(r *http.Request, body []byte) []byte {
	kind := "raw"
	if canonical, err := canonicalJSON(body); err == nil {
		kind, body = "json", canonical
	}
	return appendParts(nil, r.Method, route.Path(r), canonicalQuery(r.URL.RawQuery), kind, string(body))
}

// CanonicalQuery is the method, the path, the query's parameters in
// canonical order and the raw body. Like every change of fingerprint, a
// switch to it makes records stored before the switch answer 422 to their
// retries: switch between deploys with no retries in flight.
func CanonicalQuery(r *http.Request, body []byte) []byte {
	return appendParts(nil, r.Method, route.Path(r), canonicalQuery(r.URL.RawQuery), string(body))
}

// JSONFields is the method, the path, the canonical query and only the named
// fields of a JSON object body (dotted paths name nested fields: "payment.
// amount"), each canonical: other fields (a client timestamp, a trace id)
// may differ between the tries of one request. A field is found as
// encoding/json finds it, whatever the case of its name: when the body
// holds it under another case, or more than once, every such member
// counts, in order. A body that is not a JSON object counts as it is.
func JSONFields(fields ...string) Fingerprinter {
	fields = slices.Clone(fields)
	slices.Sort(fields)
	paths := make([][]string, len(fields))
	for i, field := range fields {
		paths[i] = strings.Split(field, ".")
	}
	return func(r *http.Request, body []byte) []byte {
		b := appendParts(nil, r.Method, route.Path(r), canonicalQuery(r.URL.RawQuery))
		v, err := decodeJSON(body)
		if _, isObject := v.(jsonObject); err != nil || !isObject {
			return appendParts(b, "raw", string(body))
		}
		b = appendParts(b, "fields")
		for i, field := range fields {
			value, selected := jsonSelect(v, paths[i])
			if selected == selectedAbsent {
				b = appendParts(b, field, "absent")
				continue
			}
			canonical, err := appendCanonical(nil, value)
			if err != nil { // a number beyond any exponent: as written
				canonical, _ = json.Marshal(value)
			}
			if selected == selectedAmbiguous {
				b = appendParts(b, field, "ambiguous", string(canonical))
				continue
			}
			b = appendParts(b, field, string(canonical))
		}
		return b
	}
}

// IncludeHeaders adds the named request headers (an API version, a tenant) to
// f's fingerprint: a retry must send the same values.
func IncludeHeaders(f Fingerprinter, names ...string) Fingerprinter {
	canonical := make([]string, len(names))
	for i, n := range names {
		canonical[i] = http.CanonicalHeaderKey(n)
	}
	slices.Sort(canonical)
	return func(r *http.Request, body []byte) []byte {
		b := f(r, body)
		for _, name := range canonical {
			b = appendParts(b, name, strings.Join(r.Header.Values(name), "\x00"))
		}
		return b
	}
}

// canonicalQuery orders a query's parameters by name, keeping the order of
// one name's values, which may matter. A query that does not parse counts
// as it is.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	return values.Encode()
}

// appendParts writes each part with its length in front, so that no part
// can be mistaken for the end of another.
func appendParts(b []byte, parts ...string) []byte {
	for _, p := range parts {
		b = append(b, byte(len(p)>>24), byte(len(p)>>16), byte(len(p)>>8), byte(len(p)))
		b = append(b, p...)
	}
	return b
}

// fingerprint is the built-in fingerprint, bound as fingerprintOf binds
// it. The body is hashed on its own first, so that a large body is read
// once and never copied.
func (c *config) fingerprint(r *http.Request, body []byte, bindCaller bool) fingerprintSum {
	bp := scratch.Get().(*[]byte)
	b := appendDefault((*bp)[:0], r, body)
	b = c.appendBinding(b, r, bindCaller)
	sum := sha256.Sum256(b)
	*bp = b
	scratch.Put(bp)
	return sum
}

// fingerprintOf is the request's fingerprint under the configuration: the
// built-in one, which allocates nothing for a request without cookies,
// unless WithFingerprint replaced it. Either way it is bound to the host
// the client addressed, which no Fingerprinter sees unless it looks, and,
// with bindCaller, to the caller's identity material, so that a
// Fingerprinter can drop neither.
func (c *config) fingerprintOf(r *http.Request, body []byte, bindCaller bool) fingerprintSum {
	if c.fingerprinter == nil {
		return c.fingerprint(r, body, bindCaller)
	}
	h := sha256.New()
	h.Write(c.fingerprinter(r, body))
	bp := scratch.Get().(*[]byte)
	b := c.appendBinding((*bp)[:0], r, bindCaller)
	h.Write(b)
	*bp = b
	scratch.Put(bp)
	var sum fingerprintSum
	h.Sum(sum[:0])
	return sum
}

// appendBinding appends what binds a fingerprint to its request's host
// and caller after a Fingerprinter's material, to be read from the end: a
// flag, the caller's digest when the flag says so, the host's length and
// the host. Whatever the material, no two bindings end it alike.
func (c *config) appendBinding(b []byte, r *http.Request, bindCaller bool) []byte {
	host := hostName(r.Host)
	b = append(b, host...)
	b = appendCount(b, len(host))
	if bindCaller {
		if sum, ok := c.callerDigest(r); ok {
			return append(append(b, sum[:]...), 1)
		}
	}
	return append(b, 0)
}
