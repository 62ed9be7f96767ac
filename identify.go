package idempotency

import (
	"fmt"
	"io"
	"strings"

	"github.com/onceonly/idempotency/internal/route"
)

// identify reads the body, the key and the scope, all before Redis is asked,
// so that malformed requests cost nothing.
func (m *Middleware) identify(c *call, extract KeyExtractor) error {
	body, err := readBody(c.r, m.cfg.maxRequest, &c.body)
	if err != nil {
		return err
	}
	key, err := extract(c.r, body)
	c.body.Seek(0, io.SeekStart) // undo whatever reading the extractor did
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrInvalidKey, err)
	case key == "":
		return ErrMissingKey
	case !validKey(key, m.cfg.maxKeyLen):
		return ErrInvalidKey
	}
	// Without WithScope, key mode claims a key once per route, the host
	// and the path the client sent; WithCallerCredentials then binds the
	// caller's credentials into the fingerprint (see caller.go), so that
	// another caller with the same key is refused as another request: it
	// neither runs again nor sees the first answer.
	routeKeys := !c.tokenMode && m.cfg.scope == nil
	bindCaller := routeKeys && m.cfg.keyCaller == callerCredentials
	if routeKeys {
		c.id = routeIdentity(hostName(c.r.Host), route.Path(c.r), key)
	} else {
		if c.tokenMode {
			err = m.tokenScope(c, key)
		} else {
			c.scope, err = m.customScope(c.r)
		}
		c.body.Seek(0, io.SeekStart) // a scope function may read the body too
		if err != nil {
			return err
		}
		c.id = identityOf(c.tokenMode, c.scope, key)
	}
	c.key = key
	c.fp = m.cfg.fingerprintOf(c.r, body, bindCaller)
	c.body.Seek(0, io.SeekStart) // and a fingerprint function too
	return nil
}

// routeIdentity names a client key of the route host+path. Its kind byte
// keeps it apart from the keys of any scope a WithScope function returns.
// A host has no NUL, nor does a path as a client sends it.
func routeIdentity(host, path, key string) identity {
	return identityOfKind('r', host, path, key)
}

// hostName is the host the client addressed, without its port and in
// lower case, so that "Shop.example:443" and "shop.example" are one host:
// tenants routed by host are told apart, and one service reached on two
// ports is not.
func hostName(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i] // "[::1]:443" keeps its brackets; "[::1]" has no port
	}
	host = strings.TrimSuffix(host, ".") // "shop.example." is the same name, fully qualified
	for i := 0; i < len(host); i++ {
		if 'A' <= host[i] && host[i] <= 'Z' {
			return strings.ToLower(host)
		}
	}
	return host
}
