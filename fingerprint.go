package idempotency

import (
	"crypto/sha256"
	"net/http"
)

// fingerprintSum identifies what a request asks for: its method, path,
// query and body. A key presented again with another fingerprint is a client
// bug (or an attack), never a retry, so it is refused rather than replayed.
type fingerprintSum [sha256.Size]byte

// fingerprint hashes the body on its own first so that a large body is read
// once and never copied.
func fingerprint(r *http.Request, body []byte) fingerprintSum {
	bodySum := sha256.Sum256(body)
	bp := scratch.Get().(*[]byte)
	b := append((*bp)[:0], r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	b = append(b, 0)
	b = append(b, r.URL.RawQuery...)
	b = append(b, 0)
	b = append(b, bodySum[:]...)
	sum := sha256.Sum256(b)
	*bp = b
	scratch.Put(bp)
	return sum
}
