package idempotency

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/idempotency/internal/cacheclock"
	"github.com/onceonly/idempotency/internal/keyspace"
)

// KeyHeader carries a client's idempotency key or an issued token.
const KeyHeader = "Idempotency-Key"

// Middleware protects handlers so that each token or key runs them at most
// once, replaying the stored response to every duplicate. It is safe for
// concurrent use; create one per application and share it.
type Middleware struct {
	cfg      config
	keyStore keyStore    // where keys live: store (Redis) or an sqlStore
	redis    *redisStore // the Redis store; nil when keys live in SQL (NewSQL)
	flights  flights
	cache    *responseCache
	later    *later
	tokens   *tokenSigner
	signers  signerWatch // names the signing key in Redis, and finds other instances' (tokensigners.go)
	outage   outageWatch // when protected routes refuse because Redis does not answer

	operatorView // the records as package admin reads them (operator.go)
}

// New returns a Middleware that keeps its state in client, which may be a
// plain, Sentinel-backed or Cluster client. It panics when an option is
// invalid, so a bad configuration fails at start-up and never per request.
func New(client redis.UniversalClient, opts ...Option) *Middleware {
	if client == nil {
		panic("idempotency: nil Redis client")
	}
	m := newMiddleware(opts)
	if m.cfg.replicaAcks > 0 {
		mustSupportReplicaAcks(client)
	}
	m.redis = newRedisStore(client, &m.cfg)
	m.keyStore = m.redis
	if now := cacheclock.Of(client); now != nil && m.cache != nil {
		m.cache.clock = now // idemtest's in-process Redis, whose clock FastForward moves
	}
	if known, enabled := contextTimeouts(client); known && !enabled {
		m.cfg.logger.Warn("idempotency: the Redis client has ContextTimeoutEnabled off, so a stalled " +
			"Redis is cut short by go-redis's ReadTimeout (3 s by default), not by WithStoreTimeout; " +
			"set ContextTimeoutEnabled: true in its options")
	}
	m.warnIfEvictable(client)
	if failoverClient(client) && m.cfg.replicaAcks == 0 {
		m.cfg.logger.Warn("idempotency: a Sentinel failover client without WithReplicaAcks: a failover loses the " +
			"claims the old primary took and did not replicate, and their retries run again (a planned SENTINEL " +
			"FAILOVER, about a second of them). WithReplicaAcks(n, timeout), n the number of replicas, runs no handler " +
			"before every replica has its claim; see docs/redis.md#sentinel")
	}
	remember(m)
	return m
}

// newMiddleware is what New and NewSQL share: the configuration, and every
// part that does not depend on where keys live.
func newMiddleware(opts []Option) *Middleware {
	m := &Middleware{cfg: newConfig(opts)}
	m.later = newLater(m)
	m.tokens = &tokenSigner{prefix: m.cfg.prefix, keys: m.cfg.tokenKeys}
	if !m.cfg.tokenKeysSet {
		m.tokens.keys = TokenKeys{Sign: processKey()}
	}
	m.signers.m = m
	m.cache = newResponseCache(m.cfg.cacheEntries, m.cfg.cacheBytes)
	m.operatorView = keyspace.NewOperated(m.operated)
	return m
}

// warnIfEvictable logs when Redis may evict the middleware's keys before
// they expire: every one of them has a TTL, so any policy but noeviction
// can drop a record (and a retry then runs its handler again) or a lock.
// A warning, not a refusal: the policy can change at run time either way,
// and a Redis kept well under maxmemory never evicts.
func (m *Middleware) warnIfEvictable(client redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(context.Background(), min(m.cfg.storeTimeout, 500*time.Millisecond))
	defer cancel()
	policy, err := evictionPolicy(ctx, client)
	switch {
	case err != nil:
		// Taken on trust: a Redis that hides both (an in-process double)
		// would otherwise log at every start.
		m.cfg.logger.Debug("idempotency: cannot read Redis's maxmemory-policy (CONFIG GET and INFO memory "+
			"refused); make sure it is noeviction", "error", err)
	case policy != "" && policy != "noeviction":
		m.cfg.logger.Warn("idempotency: Redis may evict keys under memory pressure (maxmemory-policy "+
			policy+"); an evicted record lets a retry run its handler again. Use noeviction: "+
			"a full Redis then refuses new claims (503) and keeps every stored answer",
			"maxmemory-policy", policy)
	}
}

// evictionPolicy reads maxmemory-policy with CONFIG GET, or from INFO
// memory where CONFIG is refused: managed services rename or deny it, and
// so do ACL users without @admin.
func evictionPolicy(ctx context.Context, client redis.UniversalClient) (string, error) {
	config, err := client.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil && config["maxmemory-policy"] != "" {
		return config["maxmemory-policy"], nil
	}
	info, infoErr := client.Info(ctx, "memory").Result()
	if infoErr != nil {
		return "", errors.Join(err, infoErr)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "maxmemory_policy:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", nil
}

// failoverClient reports whether client is go-redis's Sentinel-backed
// FailoverClient, which names its address so.
func failoverClient(client redis.UniversalClient) bool {
	c, ok := client.(*redis.Client)
	return ok && c.Options().Addr == "FailoverClient"
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
//	r.With(idempotency.ProtectKey(rdb, idempotency.WithCallerCredentials())).Post("/payments", pay)
//
// At shutdown, the package's Shutdown drains its Middleware with every
// other one.
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
	m.signers.started()
	return m.wrap(next, extract, true)
}

// ProtectKey wraps next in key mode: the client chooses the key (a Stripe
// style Idempotency-Key, a message id) and nothing is issued beforehand.
// It panics, at start-up, unless the Middleware was told who the callers
// are (WithCallerCredentials, WithScope or WithSharedKeys): otherwise a
// caller that sends another's key and body could receive its answer.
func (m *Middleware) ProtectKey(next http.Handler) http.Handler {
	if m.cfg.scope == nil && m.cfg.keyCaller == callerUnset {
		panic(errNoCallerRule)
	}
	extract := m.cfg.extractor
	if extract == nil {
		extract = HeaderKey(KeyHeader)
	}
	return m.wrap(next, extract, false)
}

// call is one protected request on its way through the middleware, and
// what the steps learned about it that the observer reports.
type call struct {
	ctx  context.Context // the request's, or the function caller's
	work runner          // the handler or the function the call protects
	// handler is work for a request, kept here to save an allocation.
	handler handlerRun

	w         http.ResponseWriter // nil for a function call
	r         *http.Request       // nil for a function call
	tokenMode bool
	start     time.Time
	deadline  time.Time // for waiting on another request with the same key
	flight    *flight   // the in-process flight this call leads, if any
	// changesAt is when the key's answer can next change, as the call
	// last heard from Redis (zero: it heard nothing of it).
	changesAt time.Time

	scope        string
	key          string
	tokenExpires time.Time // an issued token's (token mode)
	// lookupOnly: the token may have been spent, and must not be now (its
	// key was revoked): its record answers, or nothing.
	lookupOnly bool
	id         identity
	fp         fingerprintSum
	body       bodyReader // what the handler reads as r.Body

	fromCache bool
	waited    time.Duration
	fence     uint64
	resume    bool    // an abandoned run of the key is resumed (WithResume, Resumable)
	outage    *Outage // what this request began, continued or ended, for the observer
	failure   error   // what the handler reported of its own failure (ReportError)
}

// workName names what the call runs, for the log: a handler, or a
// function run by Do.
func (c *call) workName() string {
	if c.r == nil {
		return "function"
	}
	return "handler"
}

func (m *Middleware) wrap(next http.Handler, extract KeyExtractor, tokenMode bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		c := &call{ctx: r.Context(), w: w, r: r, tokenMode: tokenMode,
			start: now, deadline: now.Add(m.cfg.wait), resume: m.cfg.resume}
		c.handler = handlerRun{m: m, c: c, next: next}
		c.work = &c.handler
		m.serve(c, extract)
	})
}
