package idempotency

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// The stored-record decoder meets whatever Redis hands back: it must refuse
// what it cannot read, never panic, and replay what it accepts.
func FuzzDecodeReply(f *testing.F) {
	f.Add("201", "Content-Type: application/json\nLocation: /orders/1\n", []byte(`{"id":1}`), int64(86400000))
	f.Add("303", "", []byte{}, int64(1))
	f.Add("2x1", "broken", []byte{0xff}, int64(-2))
	f.Fuzz(func(t *testing.T, code, head string, body []byte, ttl int64) {
		rec, _, err := decodeReply([]any{code, head, string(body), ttl})
		if err != nil {
			return
		}
		if rec.status < 100 || rec.status > 999 {
			t.Fatalf("accepted status %d", rec.status)
		}
		w := httptest.NewRecorder()
		rec.write(w, nil, &config{})
		if !bytes.Equal(w.Body.Bytes(), body) {
			t.Fatalf("replayed body differs")
		}
	})
}

// Two requests share a fingerprint only when they ask for the same thing:
// the same method, path, query and body. Separators cannot be forged, since
// a method has no NUL, an escaped path none either, and the body's hash has
// a fixed length.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "a=1", []byte(`{"qty":1}`), "POST", "/orders", "a=1", []byte(`{"qty":2}`))
	f.Add("POST", "/a", "b", []byte(""), "POST", "/a?b", "", []byte(""))
	f.Add("PUT", "/x", "", []byte("y"), "PUT", "/x", "y", []byte(""))
	f.Fuzz(func(t *testing.T, m1, p1, q1 string, b1 []byte, m2, p2, q2 string, b2 []byte) {
		if !validMethod(m1) || !validMethod(m2) {
			return
		}
		r1 := &http.Request{Method: m1, URL: &url.URL{Path: p1, RawQuery: q1}}
		r2 := &http.Request{Method: m2, URL: &url.URL{Path: p2, RawQuery: q2}}
		same := m1 == m2 && r1.URL.EscapedPath() == r2.URL.EscapedPath() && q1 == q2 && bytes.Equal(b1, b2)
		if (fingerprint(r1, b1, true) == fingerprint(r2, b2, true)) != same {
			t.Fatalf("fingerprints of %q %q %q and %q %q %q: same request %v", m1, p1, q1, m2, p2, q2, same)
		}
	})
}

// validMethod is what net/http accepts as a method: an RFC 9110 token.
func validMethod(m string) bool {
	isTchar := func(r rune) bool {
		return r < 0x80 && (r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' ||
			strings.ContainsRune("!#$%&'*+-.^_`|~", r))
	}
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return !isTchar(r) }) < 0
}
