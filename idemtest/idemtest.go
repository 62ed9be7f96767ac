// Package idemtest backs an idempotency.Middleware with an in-process Redis
// (github.com/alicebob/miniredis/v2) for a user's own handler tests: no
// server to install or start, a fresh keyspace per test, and a clock the
// test moves itself. ExampleRedis_handlerTest shows a replay, a reused key
// (422) and Redis down (503).
//
//	func TestCreateOrder(t *testing.T) {
//		idem := idemtest.New(t, idempotency.WithCallerCredentials())
//		srv := httptest.NewServer(idem.ProtectKey(http.HandlerFunc(createOrder)))
//		defer srv.Close()
//		// POST twice with one Idempotency-Key: one order, two equal answers.
//	}
//
// Every script the library runs works on it: the claim, which takes the
// lock, the store and the release (claim.lua, complete.lua, release.lua),
// the lock's renewal (renew.lua), the operator's inspect and settle
// (Inspect, Interrupted, Resolve, Forget); so do waiting duplicates on another
// instance (pub/sub), Do, and issued tokens. This package's tests run each
// of them.
//
// What an in-process Redis cannot do, and so a test on it cannot show:
//
//   - WAIT and replicas. miniredis has no WAIT: with WithReplicaAcks every
//     claim fails and is answered 503 store-unavailable. Failover,
//     Sentinel and persistence do not exist either.
//   - Cluster. One node: no slots, no MOVED or CROSSSLOT, so a test says
//     nothing about how keys spread over a Redis Cluster.
//   - maxmemory. It has no memory limit, so a full Redis that refuses
//     claims cannot be reproduced, and it refuses CONFIG GET and INFO
//     memory, so New's warning about an evicting policy never fires.
//   - Real timing. A stalled server (SIGSTOP), a slow or lost reply, a
//     server killed with requests in flight: it answers every command at
//     once. SetError makes every command fail (the middleware answers
//     503) and Close stops it, which covers "Redis is down".
//   - Expiry by the clock. Keys expire only when the test calls
//     FastForward: a lock whose lease lapses (an instance that died
//     mid-request) stays held until then. FastForward also moves the
//     clock of the in-process response cache (WithResponseCache) of every
//     Middleware made by New or Redis.New, so a key past its record's TTL
//     runs again rather than replaying from memory; a Middleware made with
//     idempotency.New(r.Client()) keeps the wall clock for its cache, and
//     replays from it for up to WithResponseCacheTTL (10 s) after a
//     FastForward. Issued tokens are signed and expire by this process's
//     clock, which FastForward does not move; Lua's TIME (fencing tokens,
//     and the age of a claim) is the real time too. So a key whose
//     instance died reads 409 in-progress, not interrupted, until the
//     claim horizon (WithExecutionTimeout, a lease and four store
//     timeouts after the claim) has passed in real time: a test that wants
//     it interrupted sets those short and waits, or has its handler end
//     kept (a panic after its status went out), which is interrupted at
//     once.
//   - Redis's Lua. Scripts run on gopher-lua (Lua 5.1, as Redis's), with
//     the commands miniredis implements.
//   - Costs. Round trips, INFO commandstats and MONITOR are not Redis's.
//
// Tests of those behaviours belong against a real Redis; this repository's
// own run on Redis 7.0, Redis 8.0, Valkey 8.1, a Redis Cluster and Sentinel.
package idemtest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/cacheclock"
	"github.com/redis/go-redis/v9"
)

// New returns a Middleware backed by a fresh in-process Redis that is
// stopped when t ends. opts are passed to idempotency.New. Use NewRedis for
// several instances on one Redis, or to move its clock.
func New(t testing.TB, opts ...idempotency.Option) *idempotency.Middleware {
	t.Helper()
	return NewRedis(t).New(opts...)
}

// Redis is an in-process Redis for one test. Its Miniredis methods reach
// the server itself: FastForward(d) lets keys expire as if d had passed
// (and the cache entries of its Middlewares),
// SetError(msg) makes every command fail until SetError(""), Keys lists
// what the middleware wrote.
type Redis struct {
	*miniredis.Miniredis
	client *redis.Client
	ahead  atomic.Int64 // how far FastForward moved the clock, in nanoseconds
}

// NewRedis starts an in-process Redis that is stopped when t ends.
func NewRedis(t testing.TB) *Redis {
	t.Helper()
	mr := miniredis.RunT(t)
	// ContextTimeoutEnabled, as the middleware asks of every client: its
	// store timeout then bounds each exchange.
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	r := &Redis{Miniredis: mr, client: client}
	cacheclock.Set(client, r.now)
	t.Cleanup(func() {
		cacheclock.Forget(client)
		client.Close()
	})
	return r
}

// Client is a go-redis client of the in-process Redis, for the test's own
// look at it, or for idempotency.New (whose response cache, too, runs on
// this Redis's clock).
func (r *Redis) Client() *redis.Client { return r.client }

// New returns a Middleware on this Redis. Several of them are instances of
// one service: a duplicate that reaches another instance waits for the
// first and gets its answer. Its in-process response cache runs on this
// Redis's clock, which FastForward moves.
func (r *Redis) New(opts ...idempotency.Option) *idempotency.Middleware {
	return idempotency.New(r.client, opts...)
}

// FastForward moves the clock by d: keys past their TTL expire, as with
// Miniredis's own FastForward, and so do the in-process cache entries of
// every Middleware made by New, so that an answer whose record expired is
// not replayed from memory either.
func (r *Redis) FastForward(d time.Duration) {
	r.ahead.Add(int64(d))
	r.Miniredis.FastForward(d)
}

// now is the time on the clock that FastForward moves.
func (r *Redis) now() time.Time { return time.Now().Add(time.Duration(r.ahead.Load())) }
