package idempotency

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
)

// An Option configures a Middleware. Options are applied in order by New;
// defaults fill whatever they leave unset, and New panics on a configuration
// that could only fail later, per request.
type Option func(*config)

type config struct {
	prefix          string
	tokenTTL        time.Duration
	recordTTL       time.Duration
	lease           time.Duration
	wait            time.Duration
	storeTimeout    time.Duration
	execTimeout     time.Duration
	maxResponse     int
	maxRequest      int64
	maxKeyLen       int
	tokenKeys       TokenKeys
	tokenKeysSet    bool            // WithTokenKeys was given: else a random key per process
	replayHeaders   map[string]bool // nil: everything but Set-Cookie and hop-by-hop
	scope           func(*http.Request) (string, error)
	keyCaller       keyCaller
	callerHeaders   []string // canonical
	ignoredCookies  map[string]bool
	extractor       KeyExtractor
	errorHandler    func(http.ResponseWriter, *http.Request, error)
	logger          *slog.Logger
	failOpen        bool
	retryAbandoned  bool
	resume          bool
	outcomes        OutcomeStore
	replicaAcks     int
	sqlTable        string      // NewSQL's table (WithSQLTable)
	sqlListener     SQLListener // NewSQL's notifications (WithSQLListener)
	replicaWait     time.Duration
	sessionCookie   string
	formField       string
	secureCookieSet bool
	secureCookie    bool
	observer        func(Event)
	cacheSet        bool
	cacheEntries    int
	cacheBytes      int64
	cacheTTL        time.Duration
	unprotected     map[string]bool // nil: the safe methods
	optionalKey     bool
	storePolicy     StorePolicy
	replayHook      func(r *http.Request, status int, header http.Header)
	fingerprinter   Fingerprinter
	expiryHeader    string
}

// WithKeyPrefix sets the prefix of every Redis key the middleware writes.
// Default "idem". It must not contain '{' or '}', which Redis Cluster reads
// as a hash tag.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithTokenTTL sets how long an issued token stays valid. Default 1 hour.
// The store's clock decides when that has passed.
func WithTokenTTL(d time.Duration) Option { return func(c *config) { c.tokenTTL = d } }

// WithRecordTTL sets how long a stored response is replayed. It must exceed
// the claim horizon (the execution timeout, the lock lease and four store
// timeouts), so that a record outlives every execution it describes and
// every store of its answer; New panics otherwise. Default 24 hours.
func WithRecordTTL(d time.Duration) Option { return func(c *config) { c.recordTTL = d } }

// WithLockLease sets the lease of the per-key lock. A watchdog renews it every
// third of the lease while the handler runs, so the lease only bounds how long
// a crashed instance keeps a key blocked. Default 3 seconds, at least 100 ms.
func WithLockLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithWaitTimeout bounds how long a duplicate waits for the original request
// to finish before it is answered 409 Conflict with Retry-After. Default 5
// seconds.
func WithWaitTimeout(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithStoreTimeout bounds each exchange with Redis (taking the lock and
// claiming the key count as one). When Redis does not answer in time the
// request fails closed with 503 (see WithFailOpen). go-redis honours the
// bound only when the client's options set ContextTimeoutEnabled; New logs
// a warning when they do not. Default 1 second.
func WithStoreTimeout(d time.Duration) Option { return func(c *config) { c.storeTimeout = d } }

// WithExecutionTimeout bounds the handler's context once the key is claimed.
// That context does not end when the client disconnects, so that the retry
// finds a finished result. Default 30 seconds.
func WithExecutionTimeout(d time.Duration) Option { return func(c *config) { c.execTimeout = d } }

// WithMaxResponseBytes caps the response body recorded for replay. A larger
// response still reaches the client in full, but duplicates get a
// not-replayable problem instead of a partial body. Default 1 MiB.
func WithMaxResponseBytes(n int) Option { return func(c *config) { c.maxResponse = n } }

// WithMaxRequestBytes caps the request body of a protected route, which the
// middleware reads to fingerprint it. A larger body is answered 413. Default
// 1 MiB.
func WithMaxRequestBytes(n int64) Option { return func(c *config) { c.maxRequest = n } }

// WithMaxKeyLength caps the length of a client-supplied key. Longer keys are
// answered 400 before Redis is touched. Default 255.
func WithMaxKeyLength(n int) Option { return func(c *config) { c.maxKeyLen = n } }

// WithTokensPerScope used to cap the tokens a scope could hold at once,
// when issued tokens were stored. They are signed now, and issuing one
// writes nothing to Redis, so there is nothing to cap.
//
// Deprecated: it has no effect.
func WithTokensPerScope(int) Option { return func(*config) {} }

// WithReplayHeaders replaces the default header policy with an allowlist:
// only the named response headers are stored and replayed, and
// Content-Encoding, which says what the stored body's bytes are. Naming
// Set-Cookie here is the only way to replay it. Default: every header
// except Set-Cookie and the hop-by-hop headers.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		c.replayHeaders = make(map[string]bool, len(names))
		for _, n := range names {
			c.replayHeaders[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithScope sets the function that names the caller's scope (a user, API
// client or tenant id, from what the app's authentication found), in both
// modes: tokens and keys never cross scopes, and a retry from the same
// scope replays, whatever else changed in its credentials. ScopeByHeader
// and ScopeByClientCertificate are ready-made. A non-nil error answers 401
// with the no-scope problem. It takes precedence over
// WithCallerCredentials and WithSharedKeys.
//
// Default: in token mode the session cookie set by the token endpoint. Key
// mode has no default: ProtectKey panics unless WithScope,
// WithCallerCredentials or WithSharedKeys says who the callers are.
func WithScope(fn func(*http.Request) (string, error)) Option {
	return func(c *config) { c.scope = fn }
}

// WithCallerCredentials tells key mode that callers are told apart by
// their credentials, and binds them into every request's fingerprint:
// every Authorization and Proxy-Authorization value, every cookie (the
// app's own sessions included), the TLS client certificate, the query
// string (in canonical order), and the values of the headers named here
// (an API key, the user header an authenticating proxy sets). A key is
// claimed once per route, the host (without port, in lower case) and the
// path the client sent. The same key from another caller, or from a
// caller whose credentials or cookies changed between two tries, is
// refused 422 key-reused: it never runs twice and never receives another
// caller's answer. Requests with none of them share the route's keys.
// Callers that refresh tokens, log in between tries or carry cookies that
// change (a handler's Set-Cookie, analytics) are better named by WithScope.
// Name every header your callers may authenticate by: one left out lets a
// caller receive the answer of another who sent the same key and body.
func WithCallerCredentials(headers ...string) Option {
	return func(c *config) {
		c.keyCaller = callerCredentials
		c.callerHeaders = c.callerHeaders[:0]
		for _, h := range headers {
			c.callerHeaders = append(c.callerHeaders, http.CanonicalHeaderKey(h))
		}
	}
}

// WithIgnoredCookies leaves the named cookies out of what
// WithCallerCredentials binds: cookies that say nothing about who the
// caller is and change between two tries, such as a load balancer's
// sticky-session cookie renewed on every response (AWS's AWSALB and
// AWSALBCORS, GCP's GCLB) or an analytics cookie. Bound, they turn a
// client's retry into 422 key-reused. Never name a cookie that
// authenticates.
func WithIgnoredCookies(names ...string) Option {
	return func(c *config) {
		c.ignoredCookies = make(map[string]bool, len(names))
		for _, n := range names {
			c.ignoredCookies[n] = true
		}
	}
}

// WithSharedKeys tells key mode that every caller shares the keys of a
// route (its host and the path the client sent): whoever presents a key
// receives the answer stored for it, and nothing about the caller is
// checked. Use it for one caller, or callers that trust each other (a
// single webhook sender whose signature the handler checks, an internal
// queue), never for a public API.
func WithSharedKeys() Option {
	return func(c *config) { c.keyCaller, c.callerHeaders = callerShared, nil }
}

// WithKeyExtractor sets where the key (or issued token) is read from.
// Default: in token mode the Idempotency-Key header, then the form field set by
// WithFormField; in key mode the Idempotency-Key header.
func WithKeyExtractor(e KeyExtractor) Option { return func(c *config) { c.extractor = e } }

// WithErrorHandler sets the function that answers a request the middleware
// rejects. err matches one of the package's sentinel errors with errors.Is.
// Default DefaultErrorHandler, which writes a problem+json body.
func WithErrorHandler(fn func(http.ResponseWriter, *http.Request, error)) Option {
	return func(c *config) { c.errorHandler = fn }
}

// WithLogger sets where failures that no response can report are logged: a
// response that could not be stored, a lease lost mid-handler. Default
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithFailOpen runs the handler unprotected when Redis is unreachable instead
// of answering 503. Default off: without Redis nothing can stop a second
// execution. New panics when it is combined with WithOutcomeStore: a run
// without its key commits no outcome, so its retry, once Redis answers,
// would run and commit again.
func WithFailOpen() Option { return func(c *config) { c.failOpen = true } }

// WithRetryAbandoned lets a retry run the handler again when the instance
// that claimed the key vanished (its lease expired) before it stored a
// response. Pair it with fencing in the handler's storage. Default off: the
// vanished execution may have had side effects, so such a retry is answered
// 409 with the interrupted problem.
func WithRetryAbandoned() Option { return func(c *config) { c.retryAbandoned = true } }

// WithResume makes the runs of the middleware's keys resumable: a run whose
// executor is gone without storing an answer (its instance died, or it
// ended kept: cut off by the execution timeout, a panic after its status)
// is taken over by the next retry, fenced as under WithRetryAbandoned, and
// its handler runs again from the top, each step it journaled (Step)
// returning its journaled result without running. No key then answers 409
// interrupted. A run counts as gone only when nothing can store for it any
// more: it ended kept, or its lock lapsed and the claim horizon (the
// execution timeout, a lease and four store timeouts) has passed since its
// claim; until then retries wait for it, so a live run is never taken over,
// also through a Redis stall. A run that journaled a step is kept rather
// than released, also when the handler calls Release: a retry resumes it.
// Every protected handler must be safe to run again from the top: its
// effects in Steps keyed by StepKey, or fenced (FencingToken). Do calls
// opt in one by one with Resumable. Default off.
func WithResume() Option { return func(c *config) { c.resume = true } }

// WithReplicaAcks makes a claim wait until n replicas acknowledged it
// (Redis WAIT, at most timeout) before the handler runs, and fail closed with
// 503 when fewer do. Without it, a primary that dies before replicating a
// claim leaves a promoted replica that never saw it, and a retry can run the
// handler again. It costs one more round trip per first execution. The
// lease is renewed during the wait, but the timeout must be shorter than
// the lease all the same: a primary that cannot replicate a claim within
// one lease is failing, and a request should learn it (503) before its
// duplicates, which wait on the lock, give up. New panics otherwise, and
// when the client is neither a *redis.Client (plain or Sentinel) nor a
// *redis.ClusterClient: WAIT must follow the claim on one connection to the
// key's primary, which a Ring cannot give. On a Cluster the claim follows
// MOVED, ASK and TRYAGAIN during a reshard. Default off (0).
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return func(c *config) { c.replicaAcks, c.replicaWait = n, timeout }
}

// WithSessionCookie names the cookie that carries the default token scope.
// Default "idempotency_session". The token endpoint sets it (HttpOnly,
// SameSite=Lax, Path=/, no Domain) only when the caller has no cookie of
// that name, so it may name the application's own session cookie: any
// value is a scope, and the middleware never replaces it; a session the
// application starts on the same response, its cookie set before the
// token is issued, is the token's scope. A request that
// carries several cookies of the name (one planted by a sibling
// subdomain) has a token accepted when it was issued to any of them. A
// "__Host-" or "__Secure-" name, which a sibling subdomain cannot plant,
// is always sent Secure, as browsers require; New panics when
// WithSecureCookie(false) says otherwise.
func WithSessionCookie(name string) Option { return func(c *config) { c.sessionCookie = name } }

// WithSecureCookie forces the Secure attribute of the session cookie on or
// off. Default: set when the request arrived over TLS, or always for a
// prefixed name (see WithSessionCookie). Behind a proxy that terminates
// TLS, pass true.
func WithSecureCookie(secure bool) Option {
	return func(c *config) { c.secureCookieSet, c.secureCookie = true, secure }
}

// WithFormField names the hidden form field that carries an issued token.
// Default "idempotency_token".
func WithFormField(name string) Option { return func(c *config) { c.formField = name } }

// WithResponseCache bounds the in-process cache of completed responses, by
// entries and by bytes; a response larger than an eighth of the bytes is
// not cached. WithResponseCache(0, 0) turns the cache off. Default 10,000
// entries and 32 MiB.
func WithResponseCache(maxEntries int, maxBytes int64) Option {
	return func(c *config) { c.cacheSet, c.cacheEntries, c.cacheBytes = true, maxEntries, maxBytes }
}

// WithResponseCacheTTL bounds how long an entry of the in-process response
// cache answers duplicates without asking Redis, whatever the record's own
// lifetime. Redis is the truth: when it loses a record (a restart without
// persistence, a failover to a replica that never saw it), an instance that
// cached the answer would go on replaying it while another instance runs
// the key again, and this bound is how long two instances can disagree.
// Default 10 seconds, which covers double clicks and prompt retries.
func WithResponseCacheTTL(d time.Duration) Option { return func(c *config) { c.cacheTTL = d } }

// WithUnprotectedMethods names the methods that pass through a protected
// route to the handler without spending a token or key (the observer
// reports them Unprotected); every other method, one never heard of
// included, is protected. Methods compare exactly, as HTTP's do: "post" is
// not POST, and is protected. Default the safe methods, GET, HEAD, OPTIONS
// and TRACE, so that a HEAD on a GET route or a CORS preflight never spends
// a key; WithUnprotectedMethods() with none protects every method. Route by
// method, and keep a method-override middleware outside the protection:
// inside it, it could turn a GET that passed through into a POST.
func WithUnprotectedMethods(methods ...string) Option {
	return func(c *config) {
		c.unprotected = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.unprotected[m] = true
		}
	}
}

// protects reports whether requests with method are protected.
func (c *config) protects(method string) bool {
	if c.unprotected != nil {
		return !c.unprotected[method]
	}
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// WithOptionalKey lets a key-mode request (ProtectKey) that carries no key
// through to the handler unprotected (the observer reports it Unprotected),
// as Fiber, Powertools and IdempotentAPI do; a malformed or empty key is
// still refused. Token mode ignores it: a form posted without its token is
// refused, never run unprotected. Default off: a request without a key is
// answered 400 missing-key.
func WithOptionalKey() Option { return func(c *config) { c.optionalKey = true } }

// WithReplayHook calls fn with every replayed answer's status and headers
// (the stored ones, and Idempotent-Replayed) just before it is written, so
// that it may add headers or count replays. Default none.
func WithReplayHook(fn func(r *http.Request, status int, header http.Header)) Option {
	return func(c *config) { c.replayHook = fn }
}

// WithExpiryHeader adds the response header name to every protected answer,
// the first and every replay, with the whole seconds for which the key's
// stored answer is still replayed (absent when the answer is not stored),
// so that a client knows how long it may retry with the key. Default none;
// "Idempotency-Key-Expires-In" is a fair name.
func WithExpiryHeader(name string) Option {
	return func(c *config) { c.expiryHeader = http.CanonicalHeaderKey(name) }
}

// WithObserver calls fn once for every request on a protected route (those
// let through unprotected included, as Unprotected), after it was
// answered, from the request's goroutine: keep it fast. A panic in fn is
// logged, and changes no answer. LogObserver and the
// otelidem package provide ready ones. Default none, which costs nothing.
func WithObserver(fn func(Event)) Option { return func(c *config) { c.observer = fn } }

// WithFingerprint sets what makes two requests with one key the same
// request. Whatever f writes, the middleware binds the fingerprint to the
// host the request was sent to and, under WithCallerCredentials, to its
// caller's credentials. Default DefaultFingerprint.
func WithFingerprint(f Fingerprinter) Option { return func(c *config) { c.fingerprinter = f } }

// WithStorePolicy sets which answers are stored. It replaces
// WithReleaseOnServerError, and that replaces it: the last one given wins.
// Default StoreAll.
func WithStorePolicy(p StorePolicy) Option { return func(c *config) { c.storePolicy = p } }

// WithReleaseOnServerError releases the key when the handler answers 5xx, so
// a retry runs the handler again. Use it only for handlers that fail before
// any side effect. Default off: a 5xx is stored and replayed like any answer.
//
// Deprecated: use WithStorePolicy, with StoreNoTransient or a policy of your
// own; this option sets a policy that releases 5xx and stores the rest.
func WithReleaseOnServerError() Option {
	return WithStorePolicy(func(_ *http.Request, status int) StoreDecision {
		return StoreDecision{Release: status >= 500}
	})
}

// WithOutcomeStore lets the middleware recover abandoned executions from s
// rather than answer 409 interrupted. Every handler behind the middleware
// must commit its writes and its answer through s (sqlidem's Handler does):
// recovery runs a handler again whenever s holds no answer for its key, so
// a handler that wrote elsewhere would write twice. Protect other routes
// with a Middleware of their own. It cannot be combined with WithFailOpen
// (New panics): a request run unprotected would commit no outcome. Default
// none: an abandoned execution is answered 409 interrupted (or run again,
// with WithRetryAbandoned).
func WithOutcomeStore(s OutcomeStore) Option { return func(c *config) { c.outcomes = s } }

// takeover reports whether a retry may take over a key whose executor
// vanished: then a run whose lease is lost must stop, since another may
// run in its place.
func (c *config) takeover() bool { return c.retryAbandoned || c.outcomes != nil }

// claimHorizon is how long after its claim a live executor has had to
// store its answer in its own time: its run lasts up to the execution
// timeout, the store is tried three times, each within the store timeout,
// and then in the background, each try again within the store timeout.
// Until then a key whose lock lapsed is still running (a stalled Redis lets
// a live run's lock run out), and reads in progress, not interrupted. A
// store that waits out a longer outage still lands later (later.go).
func (c *config) claimHorizon() time.Duration {
	return c.execTimeout + c.lease + 4*c.storeTimeout + 100*time.Millisecond
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	setDefault(&c.prefix, "idem")
	setDefault(&c.tokenTTL, time.Hour)
	setDefault(&c.recordTTL, 24*time.Hour)
	setDefault(&c.lease, 3*time.Second)
	setDefault(&c.wait, 5*time.Second)
	setDefault(&c.storeTimeout, time.Second)
	setDefault(&c.execTimeout, 30*time.Second)
	setDefault(&c.maxResponse, 1<<20)
	setDefault(&c.maxRequest, 1<<20)
	setDefault(&c.maxKeyLen, 255)
	setDefault(&c.sessionCookie, "idempotency_session")
	setDefault(&c.formField, "idempotency_token")
	setDefault(&c.cacheTTL, 10*time.Second)
	if !c.cacheSet {
		c.cacheEntries, c.cacheBytes = 10_000, 32<<20
	}
	if c.errorHandler == nil {
		c.errorHandler = DefaultErrorHandler
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if err := c.validate(); err != nil {
		panic("idempotency: " + err.Error())
	}
	return c
}

// validToken reports whether s is an HTTP token (RFC 9110), as a header
// name must be.
func isHTTPToken(s string) bool {
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch <= ' ' || ch >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, ch) >= 0 {
			return false
		}
	}
	return s != ""
}

// setDefault fills a zero value; negative values stay and fail validation.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (c *config) validate() error {
	var ringErr error
	if c.tokenKeysSet {
		ringErr = c.tokenKeys.validate()
	}
	switch {
	case strings.ContainsAny(c.prefix, "{}"):
		return fmt.Errorf("key prefix %q contains a hash tag brace", c.prefix)
	case c.lease < 100*time.Millisecond:
		return fmt.Errorf("lock lease %v is shorter than 100ms", c.lease)
	case c.tokenTTL < time.Millisecond, c.recordTTL < time.Millisecond:
		return fmt.Errorf("token TTL %v and record TTL %v must be at least 1ms", c.tokenTTL, c.recordTTL)
	case c.wait < 0, c.storeTimeout < 0, c.execTimeout < 0, c.cacheTTL < 0:
		return fmt.Errorf("timeouts must be positive")
	case c.recordTTL <= c.claimHorizon():
		return fmt.Errorf("WithRecordTTL(%v) must exceed the lock lease (%v) plus the execution timeout (%v) "+
			"plus four store timeouts (%v): a record that expires while its handler may still run or store "+
			"lets a retry run it again", c.recordTTL, c.lease, c.execTimeout, c.storeTimeout)
	case c.replicaAcks > 0 && c.replicaWait >= c.lease:
		return fmt.Errorf("WithReplicaAcks timeout %v must be shorter than the lock lease %v (WithLockLease)",
			c.replicaWait, c.lease)
	case c.maxResponse < 0, c.maxRequest < 0, c.cacheEntries < 0, c.cacheBytes < 0:
		return fmt.Errorf("size limits must be positive")
	case c.maxKeyLen < 1 || c.maxKeyLen > 4096:
		return fmt.Errorf("max key length %d is outside 1..4096", c.maxKeyLen)
	case c.replicaAcks < 0 || (c.replicaAcks > 0 && c.replicaWait <= 0):
		return fmt.Errorf("replica acks %d need a positive timeout, got %v", c.replicaAcks, c.replicaWait)
	case c.expiryHeader != "" && !isHTTPToken(c.expiryHeader):
		return fmt.Errorf("WithExpiryHeader(%q) is not a header name", c.expiryHeader)
	case c.unprotected[""]:
		return fmt.Errorf("WithUnprotectedMethods names an empty method")
	case ringErr != nil:
		return ringErr
	case c.failOpen && c.outcomes != nil:
		return fmt.Errorf("WithFailOpen cannot be combined with WithOutcomeStore: a request run unprotected while " +
			"Redis is unreachable commits its writes without an outcome, and its retry runs them again")
	case c.sessionCookie == "" || c.formField == "":
		return fmt.Errorf("session cookie and form field names must not be empty")
	case !isHTTPToken(c.sessionCookie):
		return fmt.Errorf("session cookie name %q is not a cookie name", c.sessionCookie)
	case prefixedCookie(c.sessionCookie) && c.secureCookieSet && !c.secureCookie:
		return fmt.Errorf("WithSecureCookie(false) with the session cookie %q: browsers refuse a cookie of "+
			"that prefix without Secure, so no session would ever stick", c.sessionCookie)
	case slices.ContainsFunc(c.callerHeaders, func(h string) bool { return !isHTTPToken(h) }):
		return fmt.Errorf("WithCallerCredentials names a header that is not a header name: %q", c.callerHeaders)
	}
	return nil
}
