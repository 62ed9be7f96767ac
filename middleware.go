package idempotency

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
)

// KeyHeader carries a client's idempotency key or an issued token.
const KeyHeader = "Idempotency-Key"

// Middleware protects handlers so that each token or key runs them at most
// once, replaying the stored response to every duplicate. It is safe for
// concurrent use; create one per application and share it.
type Middleware struct {
	cfg     config
	store   *store
	flights flights
	cache   *responseCache
}

// New returns a Middleware that keeps its state in client, which may be a
// plain, Sentinel-backed or Cluster client. It panics when an option is
// invalid, so a bad configuration fails at start-up and never per request.
func New(client redis.UniversalClient, opts ...Option) *Middleware {
	if client == nil {
		panic("idempotency: nil Redis client")
	}
	m := &Middleware{cfg: newConfig(opts)}
	m.store = newStore(client, &m.cfg)
	m.cache = newResponseCache(m.cfg.cacheEntries, m.cfg.cacheBytes)
	if known, enabled := contextTimeouts(client); known && !enabled {
		m.cfg.logger.Warn("idempotency: the Redis client has ContextTimeoutEnabled off, so a stalled " +
			"Redis is cut short by go-redis's ReadTimeout (3 s by default), not by WithStoreTimeout; " +
			"set ContextTimeoutEnabled: true in its options")
	}
	return m
}

// contextTimeouts reports whether go-redis will honour our step deadlines:
// unless ContextTimeoutEnabled is set, it ignores a context's deadline on
// the socket.
func contextTimeouts(client redis.UniversalClient) (known, enabled bool) {
	switch c := client.(type) {
	case *redis.Client:
		return true, c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return true, c.Options().ContextTimeoutEnabled
	}
	return false, false
}

// ProtectKey is a one-liner for key mode, for use in chi's r.With:
//
//	r.With(idempotency.ProtectKey(rdb)).Post("/webhooks", handle)
func ProtectKey(client redis.UniversalClient, opts ...Option) func(http.Handler) http.Handler {
	return New(client, opts...).ProtectKey
}

// Protect wraps next in token mode: every request must present a token that
// this Middleware issued to the caller's scope. The first request with a
// token runs next; every later one gets its stored response.
func (m *Middleware) Protect(next http.Handler) http.Handler {
	extract := m.cfg.extractor
	if extract == nil {
		extract = FirstKey(HeaderKey(KeyHeader), FormKey(m.cfg.formField))
	}
	return m.wrap(next, extract, true)
}

// ProtectKey wraps next in key mode: the client chooses the key (a Stripe
// style Idempotency-Key, a message id) and nothing is issued beforehand.
func (m *Middleware) ProtectKey(next http.Handler) http.Handler {
	extract := m.cfg.extractor
	if extract == nil {
		extract = HeaderKey(KeyHeader)
	}
	return m.wrap(next, extract, false)
}

// call is one protected request on its way through the middleware.
type call struct {
	w         http.ResponseWriter
	r         *http.Request
	next      http.Handler
	tokenMode bool
	scope     string
	key       string
	id        identity
	fp        fingerprintSum
	start     time.Time
	deadline  time.Time  // for waiting on another request with the same key
	body      bodyReader // what the handler reads as r.Body

	// What happened, for the observer.
	outcome   Outcome
	err       error
	fromCache bool
	waited    time.Duration
	fence     uint64
}

func (m *Middleware) wrap(next http.Handler, extract KeyExtractor, tokenMode bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		c := &call{w: w, r: r, next: next, tokenMode: tokenMode, start: now, deadline: now.Add(m.cfg.wait)}
		defer m.observe(c)
		if err := m.identify(c, extract); err != nil {
			m.reject(c, err)
			return
		}
		m.protect(c)
	})
}

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
	if c.tokenMode && !isToken(key) {
		return ErrTokenNotFound
	}
	c.key = key
	c.id = identify(c.tokenMode, c.scope, key)
	c.fp = fingerprint(c.r, body)
	return nil
}

// scopeOf names who a token or key belongs to. Without a session a token
// cannot be anyone's, which is answered like any unknown token.
func (m *Middleware) scopeOf(r *http.Request, tokenMode bool) (string, error) {
	switch {
	case m.cfg.scope != nil:
		return m.customScope(r)
	case !tokenMode:
		return r.URL.Path, nil
	}
	if session, ok := m.session(r); ok {
		return session, nil
	}
	return "", ErrTokenNotFound
}

// redisKeys builds the Redis key names, which only the Redis path needs.
func (m *Middleware) redisKeys(c *call) keys {
	if c.tokenMode {
		return tokenKeys(m.cfg.prefix, c.scope, c.key)
	}
	return clientKeys(m.cfg.prefix, c.id)
}
