package idempotency

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// A stored answer was made for the first request's negotiation. A replay
// honours what the answer declares about it, under the replaying request's
// own headers:
//
//   - Content-Encoding: a body in a coding the request does not accept
//     (its Accept-Encoding names it, or *, with a q above 0; a request
//     without Accept-Encoding accepts none, as servers treat it) is sent
//     decoded when the coding is gzip or deflate, and refused as
//     ErrNotAcceptable otherwise (br, zstd: no decoder in the standard
//     library; codings applied one over another). Outer layers of the
//     replaying request compress it again by their own negotiation.
//   - Vary: the recorder stores the first request's values of the headers
//     the handler's Vary names (under varyPrefix, a name no header can
//     have); a replaying request whose value differs gets
//     ErrNotAcceptable, never an answer made for another negotiation.
//     Accept-Encoding is the coding rule above; "*" names nothing.

// varyPrefix marks a stored pair that holds the first request's value of
// a header the answer varies on. ':' is no header name's byte, as in
// http.TrailerPrefix.
const varyPrefix = "Vary:"

// appendVaried appends, for each header named by the Vary values, the
// request's values joined, under varyPrefix.
func appendVaried(pairs []string, vary []string, request http.Header) []string {
	if request == nil {
		return pairs
	}
	for _, v := range vary {
		for _, name := range strings.Split(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if name == "" || name == "*" || name == "Accept-Encoding" {
				continue
			}
			pairs = append(pairs, varyPrefix+name, strings.Join(request[name], ", "))
		}
	}
	return pairs
}

// negotiate decides how rec may be replayed to a request with header h:
// as stored, decoded (decode), or not at all (err). Codings applied one
// over another (a Content-Encoding list, or two of its lines) are passed
// on only to a request that accepts them all: the replay decodes one
// coding at most.
func (rec *record) negotiate(h http.Header) (decode bool, err error) {
	var codings []string
	for i := 0; i < len(rec.header); i += 2 {
		name, value := rec.header[i], rec.header[i+1]
		if varied, ok := strings.CutPrefix(name, varyPrefix); ok {
			if joined(h[varied]) != value {
				return false, ErrNotAcceptable
			}
			continue
		}
		if strings.EqualFold(name, "Content-Encoding") {
			codings = appendCodings(codings, value)
		}
	}
	for _, coding := range codings {
		if !accepts(h["Accept-Encoding"], coding) {
			if len(codings) == 1 && decodable(coding) {
				return true, nil
			}
			return false, ErrNotAcceptable
		}
	}
	return false, nil
}

// appendCodings appends the codings a Content-Encoding value lists, in
// lower case, leaving out identity.
func appendCodings(codings []string, value string) []string {
	for _, coding := range strings.Split(value, ",") {
		if coding = strings.ToLower(strings.TrimSpace(coding)); coding != "" && coding != "identity" {
			codings = append(codings, coding)
		}
	}
	return codings
}

// joined is a header's values as one, without allocating for one value.
func joined(values []string) string {
	if len(values) == 1 {
		return values[0]
	}
	return strings.Join(values, ", ")
}

// accepts reports whether an Accept-Encoding field accepts coding
// (RFC 9110, section 12.5.3): named, or matched by *, with a q above 0.
func accepts(field []string, coding string) bool {
	star := false
	for _, v := range field {
		for _, item := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(item, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			ok := qualityAboveZero(params)
			switch {
			case name == coding || name == "x-"+coding || "x-"+name == coding:
				return ok
			case name == "*":
				star = ok
			}
		}
	}
	return star
}

// qualityAboveZero reads the q parameter of an Accept-Encoding item.
func qualityAboveZero(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(k), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err != nil || q > 0
		}
	}
	return true
}

func decodable(coding string) bool {
	return coding == "gzip" || coding == "x-gzip" || coding == "deflate"
}

// decodeLimit bounds a decoded replay at this many times the response
// limit: text and JSON compress by a few times to a few tens, and a body
// the handler meant to send must be decodable for a client that does not
// accept its coding; a compression bomb that decodes a thousandfold must
// not be.
const decodeLimit = 32

// decodedLimit is how many bytes a replay decodes at most under cfg:
// decodeLimit times the response limit, or the most an int holds for a
// limit so large that the product would wrap (WithMaxResponseBytes of
// math.MaxInt, "no limit").
func (c *config) decodedLimit() int {
	if c.maxResponse > math.MaxInt/decodeLimit {
		return math.MaxInt
	}
	return decodeLimit * c.maxResponse
}

// codedOnly are headers that describe the body's bytes as stored, in its
// coding: a replay that sends it decoded leaves them out. An entity tag
// stays, weakened (decodedTag): the decoded body is the same resource,
// not the same bytes.
var codedOnly = map[string]bool{"Content-Digest": true, "Repr-Digest": true, "Digest": true, "Content-Md5": true}

// decodedTag weakens a strong entity tag for a body sent decoded.
func decodedTag(tag string) string {
	if strings.HasPrefix(tag, `"`) {
		return "W/" + tag
	}
	return tag
}

// errDecodedTooLarge: a stored body decodes to more than the limit.
var errDecodedTooLarge = errors.New("idempotency: the stored body decodes past the response limit")

// A body decoded for a replay is streamed to the client, never held: a
// compression-friendly answer of a few kilobytes decodes to tens of
// megabytes, and concurrent replays of it would hold that each. The body
// is decoded twice: once into nothing, which proves that it decodes, and
// within the limit, before anything is sent (decodingOf), then to the
// client (decoding.to).

// coding is the one coding of rec's body, as negotiate read it.
func (rec *record) coding() string {
	var codings []string
	for i := 0; i < len(rec.header); i += 2 {
		if strings.EqualFold(rec.header[i], "Content-Encoding") {
			codings = appendCodings(codings, rec.header[i+1])
		}
	}
	if len(codings) != 1 {
		return ""
	}
	return codings[0]
}

// A decoding is how a replay decodes a stored body: its coding, raw for a
// deflate body without zlib's wrapper (which many servers send as
// deflate), and the most bytes it may give.
type decoding struct {
	coding string
	raw    bool
	limit  int
}

// decodingOf decodes rec's body into nothing, up to limit bytes, and says
// how to decode it again. A small compressed body can decode to a
// thousand times its size, and a replay must not let whoever holds a key
// make this process decode that for a client (see decodeLimit).
func (rec *record) decodingOf(limit int) (decoding, error) {
	d := decoding{coding: rec.coding(), limit: limit}
	err := d.to(io.Discard, rec.body)
	if err != nil && d.coding == "deflate" && !errors.Is(err, errDecodedTooLarge) {
		raw := d
		raw.raw = true
		if rawErr := raw.to(io.Discard, rec.body); rawErr == nil || errors.Is(rawErr, errDecodedTooLarge) {
			return raw, rawErr
		}
	}
	return d, err
}

// to writes body, decoded, to w, up to d.limit bytes. An empty body
// decodes to nothing: an answer without a body (204, 304) may still name
// a coding.
func (d decoding) to(w io.Writer, body []byte) error {
	if len(body) == 0 {
		return nil
	}
	var rd io.ReadCloser
	var err error
	switch {
	case d.coding == "deflate" && d.raw:
		rd = flate.NewReader(bytes.NewReader(body))
	case d.coding == "deflate":
		rd, err = zlib.NewReader(bytes.NewReader(body))
	default:
		rd, err = gzip.NewReader(bytes.NewReader(body))
	}
	if err != nil {
		return err
	}
	defer rd.Close()
	n, err := io.Copy(w, io.LimitReader(rd, int64(min(d.limit, math.MaxInt-1))+1)) // one byte past: over the limit
	if err == nil && n > int64(d.limit) {
		return errDecodedTooLarge
	}
	return err
}
