package idempotency

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
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
//     library). Outer layers of the replaying request compress it again
//     by their own negotiation.
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
// as stored, decoded (decode), or not at all (err).
func (rec *record) negotiate(h http.Header) (decode bool, err error) {
	for i := 0; i < len(rec.header); i += 2 {
		name, value := rec.header[i], rec.header[i+1]
		if varied, ok := strings.CutPrefix(name, varyPrefix); ok {
			if joined(h[varied]) != value {
				return false, ErrNotAcceptable
			}
			continue
		}
		if !strings.EqualFold(name, "Content-Encoding") {
			continue
		}
		coding := strings.ToLower(strings.TrimSpace(value))
		switch {
		case coding == "" || coding == "identity" || accepts(h["Accept-Encoding"], coding):
		case decodable(coding):
			decode = true
		default:
			return false, ErrNotAcceptable
		}
	}
	return decode, nil
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

// errDecodedTooLarge: a stored body decodes to more than the limit.
var errDecodedTooLarge = errors.New("idempotency: the stored body decodes past the response limit")

// decoded is rec's body decoded from its Content-Encoding, up to limit
// bytes: a small compressed body can decode to a thousand times its size,
// and a replay must not let whoever holds a key make this process hold
// that.
func (rec *record) decoded(limit int) ([]byte, error) {
	var coding string
	for i := 0; i < len(rec.header); i += 2 {
		if strings.EqualFold(rec.header[i], "Content-Encoding") {
			coding = strings.ToLower(strings.TrimSpace(rec.header[i+1]))
		}
	}
	var rd io.ReadCloser
	var err error
	if coding == "deflate" {
		rd, err = zlib.NewReader(bytes.NewReader(rec.body))
	} else {
		rd, err = gzip.NewReader(bytes.NewReader(rec.body))
	}
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	b, err := io.ReadAll(io.LimitReader(rd, int64(limit)+1))
	if err == nil && len(b) > limit {
		return nil, errDecodedTooLarge
	}
	return b, err
}
