// Package cloudevents reads the key, the scope and the fingerprint of
// CloudEvents delivered over HTTP, for the idempotency middleware's
// WithKeyExtractor, WithScope and WithFingerprint:
//
//	idem := idempotency.New(rdb,
//		idempotency.WithKeyExtractor(cloudevents.Key),
//		idempotency.WithScope(cloudevents.Scope),
//		idempotency.WithFingerprint(cloudevents.Fingerprint),
//	)
package cloudevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/route"
)

// CloudEvents HTTP binding (https://github.com/cloudevents/spec, http-protocol-binding.md):
// in binary mode the event's attributes travel as ce-* headers and the body
// is its data; in structured mode the whole event is a JSON document whose
// content type says so.
const (
	cloudEventIDHeader     = "Ce-Id"
	cloudEventSourceHeader = "Ce-Source"
	cloudEventsJSON        = "application/cloudevents+json"
	cloudEventsBatchJSON   = "application/cloudevents-batch+json"
	cloudEventsPrefix      = "application/cloudevents"
)

// scopeBodyLimit bounds the body Scope reads when it is
// called outside the middleware, on a body nobody has read yet. Under the
// middleware the body is already in memory and WithMaxRequestBytes bounds it.
const scopeBodyLimit = 1 << 20

// Key is a KeyExtractor for CloudEvents delivered over HTTP:
//
//	idempotency.WithKeyExtractor(cloudevents.Key)
//
// A request whose content type is application/cloudevents+json (with any
// parameters, well-formed or not: none is read) is a structured-mode
// event, and the key is its "id" attribute; any other request is a
// binary-mode one, and the key is its ce-id header, percent-decoded as the
// binding prescribes. A request with no id carries
// no key (400 missing-key). A structured event that is not a JSON object,
// whose id is not a string or appears twice, a batch
// (application/cloudevents-batch+json, many ids in one request), an event in
// another structured format, a repeated ce-id header or a malformed
// percent-encoding are refused (400 invalid-key), never guessed at.
//
// An event id is unique only within its source: pair Key with
// WithScope(Scope), or two senders' ids collide.
func Key(r *http.Request, body []byte) (string, error) {
	structured, err := cloudEventStructured(r.Header)
	switch {
	case err != nil:
		return "", err
	case !structured:
		return cloudEventHeader(r.Header, cloudEventIDHeader)
	}
	attrs, err := cloudEventAttributes(body)
	if err != nil {
		return "", err
	}
	return attrs.id, nil
}

// Scope is a scope function for WithScope that puts each
// CloudEvent in the scope of its source, so that two senders' ids never
// collide:
//
//	idempotency.WithScope(cloudevents.Scope)
//
// The source is the ce-source header in binary mode, the "source" attribute
// of the body in structured mode. The scope is the route (the path the
// client sent, before http.StripPrefix or a router rewrote r.URL.Path) and
// the source together: an event fanned out to two routes that share a Redis
// runs once on each, instead of the second being refused as a reused key.
// An event without a source has no scope (401 no-scope).
//
// In structured mode it reads the request body. Under the middleware that is
// the copy the middleware already read, and the body is left where it was
// for the handler; called elsewhere, it reads up to 1 MiB of the body and
// puts what it read back in r.Body.
func Scope(r *http.Request) (string, error) {
	structured, err := cloudEventStructured(r.Header)
	if err != nil {
		return "", err
	}
	var source string
	if structured {
		body, err := peekBody(r)
		if err != nil {
			return "", err
		}
		attrs, err := cloudEventAttributes(body)
		if err != nil {
			return "", err
		}
		source = attrs.source
	} else if source, err = cloudEventHeader(r.Header, cloudEventSourceHeader); err != nil {
		return "", err
	}
	if source == "" {
		return "", errors.New("cloudevents: CloudEvent without a source")
	}
	// Length-prefixed so that no path and source pair reads as another.
	path := route.Path(r)
	return strconv.Itoa(len(path)) + ":" + path + source, nil
}

// cloudEventStructured tells a structured-mode event from a binary-mode one
// by its content type, and refuses the structured forms this package cannot
// read. The media type is what comes before the first ';', trimmed and
// lowercased (media types are case-insensitive); sdk-go's format.Lookup
// also reads no further. The parameters are not parsed, so that a
// malformed one ("application/cloudevents+json; charset", which
// mime.ParseMediaType refuses) cannot turn a structured event into a
// binary one, whose key would be a stray ce-id header instead of the
// event's own id.
func cloudEventStructured(h http.Header) (bool, error) {
	mediaType, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	mediaType = strings.ToLower(strings.TrimSpace(mediaType))
	if !strings.HasPrefix(mediaType, cloudEventsPrefix) {
		return false, nil // binary mode: the content type is the data's own
	}
	switch mediaType {
	case cloudEventsJSON:
		return true, nil
	case cloudEventsBatchJSON:
		return false, errors.New("cloudevents: a CloudEvents batch has no single id")
	}
	return false, fmt.Errorf("cloudevents: unsupported CloudEvents format %q", mediaType)
}

// cloudEventHeader reads a binary-mode attribute. The binding
// percent-encodes header values (RFC 3986), so that the value read is the
// attribute a structured-mode copy of the event would carry.
func cloudEventHeader(h http.Header, name string) (string, error) {
	values := h[name]
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("cloudevents: %s header repeated", name)
	}
	value, err := url.PathUnescape(values[0])
	if err != nil {
		return "", fmt.Errorf("cloudevents: %s header: %w", name, err)
	}
	return value, nil
}

// cloudEventAttrs are the attributes that identify an event.
type cloudEventAttrs struct{ id, source string }

// cloudEventAttributes reads id and source from a structured-mode event.
// It walks the top-level object itself rather than unmarshalling into a
// struct: encoding/json matches field names case-insensitively, so "ID"
// would pass for "id", and a repeated attribute would silently take its
// last value; both are refused here. The data attribute is scanned but not
// copied.
func cloudEventAttributes(body []byte) (cloudEventAttrs, error) {
	var attrs cloudEventAttrs
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return attrs, errors.New("cloudevents: structured CloudEvent is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return attrs, fmt.Errorf("cloudevents: structured CloudEvent: %w", err)
		}
		name, _ := tok.(string)
		var dst *string
		switch name {
		case "id":
			dst = &attrs.id
		case "source":
			dst = &attrs.source
		default:
			if err := dec.Decode(&skipJSON{}); err != nil {
				return attrs, fmt.Errorf("cloudevents: structured CloudEvent: %w", err)
			}
			continue
		}
		if seen[name] {
			return attrs, fmt.Errorf("cloudevents: structured CloudEvent repeats %q", name)
		}
		seen[name] = true
		// null leaves the attribute absent; anything but a string fails.
		if err := dec.Decode(dst); err != nil {
			return attrs, fmt.Errorf("cloudevents: structured CloudEvent %q: %w", name, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return attrs, fmt.Errorf("cloudevents: structured CloudEvent: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return attrs, errors.New("cloudevents: structured CloudEvent has data after the object")
	}
	return attrs, nil
}

// skipJSON consumes one JSON value without keeping it.
type skipJSON struct{}

func (*skipJSON) UnmarshalJSON([]byte) error { return nil }

// peekBody returns the request body and leaves it for the handler to read.
// Under the middleware r.Body is the in-memory copy it read, which can be
// re-read and put back where it was; otherwise the body is read once and
// replaced by what was read.
func peekBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if rs, ok := r.Body.(io.ReadSeeker); ok {
		pos, err := rs.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		if _, err := rs.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		body, err := io.ReadAll(rs)
		if _, serr := rs.Seek(pos, io.SeekStart); err == nil {
			err = serr
		}
		return body, err
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, scopeBodyLimit+1))
	r.Body = &replacedBody{read: bytes.NewReader(body), orig: r.Body}
	if err != nil {
		return nil, err
	}
	if len(body) > scopeBodyLimit {
		return nil, idempotency.ErrRequestTooLarge
	}
	return body, nil
}

// replacedBody hands the handler the bytes peekBody read, then the rest of
// the original body, and closes the original.
type replacedBody struct {
	read *bytes.Reader
	orig io.ReadCloser
}

func (b *replacedBody) Read(p []byte) (int, error) {
	if b.read.Len() > 0 {
		return b.read.Read(p)
	}
	return b.orig.Read(p)
}

func (b *replacedBody) Close() error { return b.orig.Close() }
