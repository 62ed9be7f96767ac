package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"time"
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
	c.scope, err = m.scopeOf(c.r, c.tokenMode)
	c.body.Seek(0, io.SeekStart) // a scope function may read the body too
	if err != nil {
		return err
	}
	if c.tokenMode {
		// Unknown, expired and another scope's tokens are refused here,
		// before Redis is asked, and all three alike.
		expires, issued, err := m.tokens.check(c.ctx, c.scope, key, time.Now())
		if err != nil {
			return err
		}
		if !issued {
			return ErrTokenNotFound
		}
		c.tokenExpires = expires
	}
	c.key = key
	c.id = identityOf(c.tokenMode, c.scope, key)
	c.fp = m.cfg.fingerprintOf(c.r, body)
	c.body.Seek(0, io.SeekStart) // and a fingerprint function too
	return nil
}

// scopeOf names who a token or key belongs to. Without a session a token
// cannot be anyone's, which is answered like any unknown token. A client
// key belongs to the caller whenever the request names one, so that a key
// that two callers happen to share (or one caller learns of another's)
// never shows one the other's answer; only an anonymous request's key
// belongs to the route.
func (m *Middleware) scopeOf(r *http.Request, tokenMode bool) (string, error) {
	if m.cfg.scope != nil {
		return m.customScope(r)
	}
	// Most API requests carry no cookie: skip parsing what is not there.
	session, hasSession := "", false
	if len(r.Header["Cookie"]) > 0 {
		session, hasSession = m.session(r)
	}
	switch {
	case tokenMode && hasSession:
		return session, nil
	case tokenMode:
		return "", ErrTokenNotFound
	case hasSession:
		return "s:" + session, nil
	}
	if auth := r.Header["Authorization"]; len(auth) > 0 {
		h := sha256.New()
		for _, v := range auth {
			h.Write([]byte(v))
			h.Write([]byte{0})
		}
		return "a:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
	}
	return r.URL.Path, nil // a path starts with '/', so it is never taken for a caller
}

// redisKeys builds the Redis key names, which only the Redis path needs.
func (m *Middleware) redisKeys(c *call) keys {
	if c.tokenMode {
		k := tokenKeys(m.cfg.prefix, c.scope, c.key)
		k.tokenExpires = c.tokenExpires
		return k
	}
	return clientKeys(m.cfg.prefix, c.id)
}
