package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"time"
)

// keys names the Redis keys one protected request touches. They share one
// hash tag, so the scripts and the lock work on Redis Cluster:
//
//	token mode: PREFIX:{t<scope digest>}:r:<token> record
//	            PREFIX:{t<scope digest>}:l:<token> lock
//	key mode:   PREFIX:{k<scope+key digest>}:r     record
//	            PREFIX:{k<scope+key digest>}:l     lock
//	tokens:     PREFIX:token-signers               which keys signed tokens lately, by fingerprint (tokensigners.go)
//
// A token-mode tag spreads scopes over the cluster. A key-mode tag hashes
// the client's key, so a busy route spreads over every shard and no
// client-chosen byte reaches a key name.
type keys struct {
	record       string
	lock         string
	token        string    // the issued token, token mode only
	tokenExpires time.Time // when token expires
	lookupOnly   bool      // the token is never spent now (tokenRevoked)
	resume       bool      // the claim resumes an abandoned run (WithResume)
	// names holds record, lock and the waiters flag, made once per request
	// for the scripts' KEYS by tokenKeys or clientKeys, the only makers of
	// keys.
	names *[3]string
}

// lifetime is how long the record is kept when ttl is asked for: at least
// as long as an issued token lives, since the record is what keeps the
// token spent. The store judges the expiry on its own clock, but the
// record's life is counted here, on this instance's: clockAllowance past
// the expiry, the record outlives the token on a store's clock that is
// behind this one by up to that much.
func (k keys) lifetime(ttl time.Duration) time.Duration {
	if k.token == "" {
		return ttl
	}
	return max(ttl, time.Until(k.tokenExpires)+clockAllowance)
}

// clockAllowance is how far the store's clock may be behind an instance's
// without a spent token's record expiring before the token does on the
// store's clock (and the token claimable again): far beyond what NTP
// leaves between two machines.
const clockAllowance = time.Minute

// redisKeys builds the Redis key names, which only the Redis path needs.
func (m *Middleware) redisKeys(c *call) keys {
	if c.tokenMode {
		k := tokenKeys(m.cfg.prefix, c.scope, c.key)
		k.tokenExpires, k.lookupOnly, k.resume = c.tokenExpires, c.lookupOnly, c.resume
		return k
	}
	k := clientKeys(m.cfg.prefix, c.id)
	k.resume = c.resume
	return k
}

// tokenKeys names a token's keys after its scope.
func tokenKeys(prefix, scope, token string) keys {
	var tag [48]byte
	t := appendTag(tag[:0], prefix, 't', scopeDigest(scope))
	// One string holds the three names ("…r:<token>:w…l:<token>"), sliced.
	n := len(t) + 2 + len(token)
	b := append(append(t, "r:"...), token...)
	b = append(append(b, ":w"...), b[:len(t)]...)
	all := string(append(append(b, "l:"...), token...))
	return keys{token: token, record: all[:n], lock: all[n+2:],
		names: &[3]string{all[:n], all[n+2:], all[:n+2]}}
}

// clientKeys names a client key's keys after its identity, which already
// digests scope and key.
func clientKeys(prefix string, id identity) keys {
	var tag [48]byte
	t := appendTag(tag[:0], prefix, 'k', id)
	// One string holds the three names ("…r:w…l"), sliced: one allocation
	// for what the scripts name on every request.
	n := len(t)
	all := string(append(append(append(t, "r:w"...), t...), 'l'))
	return keys{record: all[:n+1], lock: all[n+3:], names: &[3]string{all[:n+1], all[n+3:], all[:n+3]}}
}

// appendTag appends "PREFIX:{<kind><digest>}:" to b.
func appendTag(b []byte, prefix string, kind byte, d [16]byte) []byte {
	b = append(b, prefix...)
	b = append(b, ':', '{', kind)
	b = base64.RawURLEncoding.AppendEncode(b, d[:])
	return append(b, '}', ':')
}

// scopeDigest shortens an arbitrary scope to 128 bits; appendTag writes it
// URL-safe and brace-free.
func scopeDigest(s string) [16]byte {
	bp := scratch.Get().(*[]byte)
	b := append((*bp)[:0], s...)
	sum := sha256.Sum256(b)
	*bp = b
	scratch.Put(bp)
	return [16]byte(sum[:16])
}

// waiters names the flag that says another instance waits for the key's
// lock, and the channel it waits on (keyspace.Waiters of the record).
func (k keys) waiters() string { return k.names[2] }

// redisKeys are claim.lua's KEYS: the record and the lock.
func (k keys) redisKeys() []string { return k.names[:2:2] }

// lockKey is unlock.lua's KEYS: the lock.
func (k keys) lockKey() []string { return k.names[1:2:2] }

// flagged are the KEYS of the scripts that end a lease: the record, the
// lock and the waiters flag.
func (k keys) flagged() []string { return k.names[:] }

// identity names a token or key inside this process (the in-flight table
// and the response cache) without building the Redis key strings, which a
// request answered from memory never needs.
type identity [16]byte

// scratch buffers let the hot path hash several strings without allocating.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

func identityOf(tokenMode bool, scope, key string) identity {
	kind := byte('k')
	if tokenMode {
		kind = 't'
	}
	return identityOfKind(kind, scope, key)
}

// identityOfKind hashes kind first, so that identities of tokens ('t'),
// request keys ('k'), route keys ('r') and function calls ('f') never
// meet, whatever scope a WithScope function returns; then the parts (a
// scope, or a host and a path, and the key), each after a NUL but the
// first.
func identityOfKind(kind byte, parts ...string) identity {
	bp := scratch.Get().(*[]byte)
	b := append((*bp)[:0], kind)
	for i, part := range parts {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, part...)
	}
	sum := sha256.Sum256(b)
	*bp = b
	scratch.Put(bp)
	return identity(sum[:16])
}
