// Package route names the route a request was sent to as its client sent
// it, for the middleware's keys and fingerprints and for the CloudEvents
// scope, which must agree on it.
package route

import (
	"net/http"
	"net/url"
	"strings"
)

// Path is the request's path as the client sent it (escaped), before
// any router or http.StripPrefix rewrote r.URL.Path: two mounts of one
// handler are two routes. A request handed to a handler directly has no
// RequestURI, and its URL is all there is.
func Path(r *http.Request) string {
	uri := r.RequestURI
	switch {
	case uri == "":
		return unreserved(r.URL.EscapedPath())
	case uri[0] == '/':
		if i := strings.IndexByte(uri, '?'); i >= 0 {
			return unreserved(uri[:i])
		}
		return unreserved(uri)
	}
	// The absolute form a proxy is sent, or "*".
	if u, err := url.ParseRequestURI(uri); err == nil {
		return unreserved(u.EscapedPath())
	}
	return uri
}

// unreserved decodes the percent-escapes of unreserved characters (letters,
// digits, "-", ".", "_", "~"), which RFC 3986 makes equivalent to the
// characters themselves: /%70ay is /pay, to a router and to us. Every other
// escape stays, so /a%2Fb and /a/b remain two paths.
func unreserved(path string) string {
	i := strings.IndexByte(path, '%')
	if i < 0 {
		return path
	}
	b := make([]byte, 0, len(path))
	for ; i >= 0; i = strings.IndexByte(path, '%') {
		b = append(b, path[:i]...)
		if i+2 < len(path) {
			if c, ok := unhex2(path[i+1], path[i+2]); ok && isUnreserved(c) {
				b = append(b, c)
				path = path[i+3:]
				continue
			}
		}
		b = append(b, '%')
		path = path[i+1:]
	}
	return string(append(b, path...))
}

func unhex2(hi, lo byte) (byte, bool) {
	h, ok1 := unhex(hi)
	l, ok2 := unhex(lo)
	return h<<4 | l, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
