package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
)

// Key mode must know who sent a request, or one caller's stored answer
// would reach another who sends the same key and body. Nothing in a
// request says which of its parts names the caller (an Authorization
// header, a cookie, an API-key header, a client certificate, a proxy's
// user header, a query parameter), so ProtectKey refuses to start until
// the application says it: WithCallerCredentials binds the caller's
// credentials into each request's fingerprint, WithScope names the caller
// (ScopeByHeader and ScopeByClientCertificate are ready-made), and
// WithSharedKeys declares that every caller shares the keys.

// keyCaller is the rule key mode follows when WithScope is not given.
type keyCaller int

const (
	callerUnset       keyCaller = iota // ProtectKey refuses to start
	callerCredentials                  // the credentials are bound into the fingerprint
	callerShared                       // every caller shares the route's keys
)

// errNoCallerRule is ProtectKey's panic when nothing says who the callers are.
const errNoCallerRule = "idempotency: ProtectKey needs to know who the callers are, or one caller's " +
	"stored answer could reach another: pass WithCallerCredentials (Authorization, Proxy-Authorization, " +
	"cookies, the TLS client certificate and the headers you name), WithScope (ScopeByHeader, " +
	"ScopeByClientCertificate or your own function) or WithSharedKeys (every caller shares the keys)"

// ScopeByHeader names the caller by the values of the request header name
// (an API key, a client id an authenticating proxy sets, Authorization for
// long-lived credentials), for WithScope. The scope is a digest of the
// values, so that no credential reaches Redis, the logs or an observer. A
// request without the header is refused 401 no-scope. A caller whose
// value changes between two tries (a refreshed bearer token) is another
// scope, and its retry runs again: name such callers by what your
// authentication found instead, or bind them with WithCallerCredentials,
// which refuses such a retry rather than run it. Only use a header that
// your authentication checks, or that a proxy in front of the
// application sets and strips from what clients send.
func ScopeByHeader(name string) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(name)
	label := "header " + name + " "
	return func(r *http.Request) (string, error) {
		values := r.Header[name]
		if len(values) == 0 {
			return "", ErrNoScope
		}
		b := appendCount(nil, len(values))
		for _, v := range values {
			b = appendParts(b, v)
		}
		return digestScope(label, b), nil
	}
}

// ScopeByClientCertificate names the caller by the certificate it
// presented in the TLS handshake (mutual TLS), for WithScope: a digest of
// the leaf certificate. A request without one is refused 401 no-scope.
// Behind a proxy that terminates TLS, the certificate does not reach the
// application: use ScopeByHeader with the header the proxy sets.
func ScopeByClientCertificate() func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			return "", ErrNoScope
		}
		return digestScope("tls ", r.TLS.PeerCertificates[0].Raw), nil
	}
}

// digestScope is label followed by the hex digest of material.
func digestScope(label string, material []byte) string {
	sum := sha256.Sum256(material)
	return label + hex.EncodeToString(sum[:])
}

// callerSum is a digest of a caller's identity material.
type callerSum [sha256.Size]byte

// credentialHeaders are the headers WithCallerCredentials always binds.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization"}

// callerDigest digests the caller's identity material under
// WithCallerCredentials: every value of each credential header (the
// standard ones, then the declared ones), in order; every cookie, sorted
// by name and value so that neither their order nor their split over
// several Cookie lines (HTTP/2 sends one per cookie) counts, but for those
// WithIgnoredCookies names; the TLS client certificate; the query string,
// in canonical order, where some APIs carry a key. ok is false for a
// request with none of them, which costs nothing to find.
func (c *config) callerDigest(r *http.Request) (sum callerSum, ok bool) {
	var cookies []*http.Cookie
	if len(r.Header["Cookie"]) > 0 {
		cookies = r.Cookies()
		if len(c.ignoredCookies) > 0 {
			cookies = slices.DeleteFunc(cookies, func(k *http.Cookie) bool { return c.ignoredCookies[k.Name] })
		}
	}
	present := len(cookies) > 0 || r.URL.RawQuery != "" ||
		(r.TLS != nil && len(r.TLS.PeerCertificates) > 0)
	for _, headers := range [2][]string{credentialHeaders, c.callerHeaders} {
		for _, h := range headers {
			present = present || len(r.Header[h]) > 0
		}
	}
	if !present {
		return sum, false
	}
	bp := scratch.Get().(*[]byte)
	b := (*bp)[:0]
	for _, headers := range [2][]string{credentialHeaders, c.callerHeaders} {
		for _, h := range headers {
			values := r.Header[h]
			b = appendCount(b, len(values))
			for _, v := range values {
				b = appendParts(b, v)
			}
		}
	}
	slices.SortFunc(cookies, func(a, b *http.Cookie) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	b = appendCount(b, len(cookies))
	for _, c := range cookies {
		b = appendParts(b, c.Name, c.Value)
	}
	var cert []byte
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		cert = r.TLS.PeerCertificates[0].Raw
	}
	b = appendParts(b, string(cert), canonicalQuery(r.URL.RawQuery))
	sum = sha256.Sum256(b)
	*bp = b
	scratch.Put(bp)
	return sum, true
}

func appendCount(b []byte, n int) []byte {
	return append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}
