package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// fingerprint identifies what a request asks for: its method, path, query
// and body. A key presented again with another fingerprint is a client bug
// (or an attack), never a retry, so it is refused rather than replayed.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.EscapedPath()))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.RawQuery))
	h.Write([]byte{0})
	h.Write(body)
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0]))
}
