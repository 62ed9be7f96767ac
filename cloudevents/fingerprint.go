package cloudevents

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/onceonly/idempotency"
)

// transportNoise are the attributes that a sender may change between two
// deliveries of one event: the Distributed Tracing extension's, which
// name the delivery's trace, not the event.
var transportNoise = []string{"traceparent", "tracestate"}

// Fingerprint is a Fingerprinter for CloudEvents, for WithFingerprint: two
// deliveries with one id (and source) are the same event when every
// attribute but the transport's is the same, in either mode alike: type,
// subject, dataschema, datacontenttype, time, specversion and every
// extension, and the data. The attributes of the Distributed Tracing
// extension (traceparent, tracestate), which name a delivery rather than
// the event, are left out, as are the headers of the transport.
//
// Binary mode: the ce-* headers, percent-decoded, the Content-Type (the
// event's datacontenttype) and the body's bytes. Structured mode: the
// event's JSON object as canonical JSON (member order, spacing and number
// spelling do not count). Either way the method, the path and the query
// count too, as in idempotency.DefaultFingerprint. Each mode is compared
// with itself: one event delivered once in binary mode and once in
// structured mode is two requests, and the second gets 422 key-reused.
//
// Without it, binary mode fingerprints only the data: an event that
// reuses an id under the same source with the same data but another type
// would be answered as the first (its own effect lost), where structured
// mode refuses it (422 key-reused).
func Fingerprint(r *http.Request, body []byte) []byte {
	structured, err := cloudEventStructured(r.Header)
	if err == nil && structured {
		return idempotency.CanonicalJSON(r, withoutNoise(body))
	}
	var names []string
	for name := range r.Header {
		attr, isAttr := strings.CutPrefix(strings.ToLower(name), "ce-")
		if isAttr && !slices.Contains(transportNoise, attr) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	b := appendPart(idempotency.DefaultFingerprint(r, body), "binary")
	for _, name := range names {
		b = appendPart(b, strings.ToLower(name))
		for _, v := range r.Header[name] {
			if decoded, err := url.PathUnescape(v); err == nil {
				v = decoded
			}
			b = appendPart(b, v)
		}
	}
	return appendPart(appendPart(b, "datacontenttype"), r.Header.Get("Content-Type"))
}

// withoutNoise is a structured event without its transport's attributes,
// or body as it is when it is not a JSON object.
func withoutNoise(body []byte) []byte {
	var event map[string]json.RawMessage
	if json.Unmarshal(body, &event) != nil || event == nil {
		return body
	}
	for _, name := range transportNoise {
		delete(event, name)
	}
	out, err := json.Marshal(event)
	if err != nil {
		return body
	}
	return out
}

// appendPart writes p with its length in front, so that no part can be
// mistaken for the end of another.
func appendPart(b []byte, p string) []byte {
	b = append(b, byte(len(p)>>24), byte(len(p)>>16), byte(len(p)>>8), byte(len(p)))
	return append(b, p...)
}
