package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/bsm/redislock"
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
	return m
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
	return m.wrap(next, extract, m.tokenModeKeys)
}

// ProtectKey wraps next in key mode: the client chooses the key (a Stripe
// style Idempotency-Key, a message id) and nothing is issued beforehand.
func (m *Middleware) ProtectKey(next http.Handler) http.Handler {
	extract := m.cfg.extractor
	if extract == nil {
		extract = HeaderKey(KeyHeader)
	}
	return m.wrap(next, extract, m.keyModeKeys)
}

type keyResolver func(r *http.Request, key string) (keys, error)

func (m *Middleware) wrap(next http.Handler, extract KeyExtractor, resolve keyResolver) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline := time.Now().Add(m.cfg.wait)
		body, err := readBody(r, m.cfg.maxRequest)
		if err != nil {
			m.cfg.errorHandler(w, r, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		key, err := extract(r, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		switch {
		case err != nil:
			err = fmt.Errorf("%w: %w", ErrInvalidKey, err)
		case key == "":
			err = ErrMissingKey
		case !validKey(key, m.cfg.maxKeyLen):
			err = ErrInvalidKey
		}
		if err != nil {
			m.cfg.errorHandler(w, r, err)
			return
		}
		k, err := resolve(r, key)
		if err != nil {
			m.cfg.errorHandler(w, r, err)
			return
		}
		m.protect(w, r, next, k, fingerprint(r, body), deadline)
	})
}

func (m *Middleware) tokenModeKeys(r *http.Request, token string) (keys, error) {
	var scope string
	if m.cfg.scope != nil {
		s, err := m.customScope(r)
		if err != nil {
			return keys{}, err
		}
		scope = s
	} else if s, ok := m.session(r); ok {
		scope = s
	} else {
		return keys{}, ErrTokenNotFound
	}
	if !isToken(token) {
		return keys{}, ErrTokenNotFound
	}
	return tokenKeys(m.cfg.prefix, scope, token), nil
}

func (m *Middleware) keyModeKeys(r *http.Request, key string) (keys, error) {
	scope := r.URL.Path
	if m.cfg.scope != nil {
		s, err := m.customScope(r)
		if err != nil {
			return keys{}, err
		}
		scope = s
	}
	return clientKeys(m.cfg.prefix, scope, key), nil
}

// readBody reads the whole request body, which the fingerprint needs before
// anything runs.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, ErrRequestTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, ErrUnreadableBody
	}
	if n > limit {
		return nil, ErrRequestTooLarge
	}
	return buf.Bytes(), nil
}

// protect answers one request for k. Concurrent requests for k in this
// process queue behind the first in memory; only that one talks to Redis.
func (m *Middleware) protect(w http.ResponseWriter, r *http.Request, next http.Handler, k keys, fp string, deadline time.Time) {
	for {
		fl, leader := m.flights.join(k.record, fp)
		if leader {
			var shared *record
			defer func() { m.flights.land(k.record, fl, shared) }()
			shared = m.lead(w, r, next, k, fp, deadline)
			return
		}
		if !m.await(w, r, fl, fp, deadline) {
			return
		}
	}
}

// await waits for another request's flight. It answers r and returns false,
// or returns true when r must ask Redis itself.
func (m *Middleware) await(w http.ResponseWriter, r *http.Request, fl *flight, fp string, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-fl.done:
	case <-timer.C:
		m.cfg.errorHandler(w, r, ErrInProgress)
		return false
	case <-r.Context().Done():
		return false // nobody is listening, and nothing ran for this request
	}
	switch {
	case fl.rec == nil:
		return true
	case fl.fingerprint != fp:
		m.cfg.errorHandler(w, r, ErrKeyReused)
	default:
		fl.rec.write(w)
	}
	return false
}

// lead takes the lock, claims the key and acts on the claim. It returns the
// stored answer when there is one for waiting requests to replay.
func (m *Middleware) lead(w http.ResponseWriter, r *http.Request, next http.Handler, k keys, fp string, deadline time.Time) *record {
	lock, err := m.acquire(r, k, deadline)
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, ErrStoreUnavailable) && m.cfg.failOpen:
		m.cfg.logger.Warn("idempotency: Redis unavailable, running the handler unprotected", "error", err)
		next.ServeHTTP(w, r)
		return nil
	case err != nil:
		m.cfg.errorHandler(w, r, err)
		return nil
	}
	ctx, cancel := m.store.stepContext(r.Context())
	c, err := m.store.claim(ctx, k, lock.Token(), fp)
	cancel()
	if err != nil {
		// The claim may have run without us hearing back. Undo it if so;
		// when Redis cannot hear that either, the lease runs out and a
		// retry finds the claim abandoned, with the handler never run.
		m.releaseQuietly(r, k, lock.Token())
		m.cfg.errorHandler(w, r, unavailable(err))
		return nil
	}
	switch c.outcome {
	case outcomeClaimed:
		return m.execute(w, r, next, k, lock, c.fence)
	case outcomeDone:
		c.rec.write(w)
		return c.rec
	case outcomeUnknown:
		err = ErrTokenNotFound
	case outcomeMismatch:
		err = ErrKeyReused
	case outcomeBig:
		err = ErrNotReplayable
	case outcomeAbandoned:
		err = ErrInterrupted
	default: // outcomeLost: Redis was slower than the whole lease
		err = unavailable(errors.New("lock lease ran out before the claim"))
	}
	m.cfg.errorHandler(w, r, err)
	return nil
}

// acquire takes k's lock, waiting with back-off while another instance holds
// it, until the deadline (ErrInProgress) or the client leaves
// (context.Canceled).
func (m *Middleware) acquire(r *http.Request, k keys, deadline time.Time) (*redislock.Lock, error) {
	wait := 2 * time.Millisecond
	for {
		ctx, cancel := m.store.stepContext(r.Context())
		lock, err := m.store.obtain(ctx, k)
		cancel()
		if err == nil {
			return lock, nil
		}
		if !errors.Is(err, redislock.ErrNotObtained) {
			return nil, unavailable(err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, ErrInProgress
		}
		timer := time.NewTimer(min(wait, left))
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return nil, context.Canceled
		}
		wait = backoff(wait, 50*time.Millisecond)
	}
}

// execute runs the handler once under the claimed key and stores its answer.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, k keys, lock *redislock.Lock, fence uint64) *record {
	// Once the key is claimed the handler must finish: a client that gives
	// up (a double-clicking browser aborts its first POST) retries and must
	// find this execution's result, not a half-done one.
	ctx, cancelTimeout := context.WithTimeout(withFence(context.WithoutCancel(r.Context()), fence), m.cfg.execTimeout)
	defer cancelTimeout()
	ctx, cancelLost := context.WithCancelCause(ctx)
	defer cancelLost(nil)
	wd := startWatchdog(lock, m.cfg.lease, m.cfg.storeTimeout, func() { cancelLost(ErrLockLost) })

	rw := newRecorder(w, &m.cfg)
	returned := false
	defer func() {
		if !returned {
			// The handler panicked. Nothing is stored as its answer; the key
			// is released so that a retry runs, and the panic carries on to
			// the server's recoverer.
			wd.stop()
			m.releaseQuietly(r, k, lock.Token())
		}
	}()
	next.ServeHTTP(rw, r.WithContext(ctx))
	returned = true
	defer wd.stop()

	rec := rw.result()
	if rec != nil && rec.status >= 500 && m.cfg.releaseOn5xx {
		m.releaseQuietly(r, k, lock.Token())
		return nil
	}
	if err := m.complete(r, k, lock.Token(), rec); err != nil {
		m.cfg.logger.Error("idempotency: handler ran but its response was not stored",
			"key", k.record, "error", err)
		return nil
	}
	return rec
}

// complete stores the answer, trying again briefly: the handler has run, and
// a lost store turns every retry into an interrupted-execution answer.
func (m *Middleware) complete(r *http.Request, k keys, lockValue string, rec *record) error {
	var err error
	for attempt, pause := 0, 10*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*2 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		ctx, cancel := m.store.stepContext(r.Context())
		err = m.store.complete(ctx, k, lockValue, rec)
		cancel()
		if err == nil || errors.Is(err, ErrLockLost) {
			return err
		}
	}
	return err
}

func (m *Middleware) releaseQuietly(r *http.Request, k keys, lockValue string) {
	ctx, cancel := m.store.stepContext(r.Context())
	defer cancel()
	if err := m.store.release(ctx, k, lockValue); err != nil {
		m.cfg.logger.Warn("idempotency: could not release a claim; it ends with its lease",
			"key", k.record, "error", err)
	}
}
