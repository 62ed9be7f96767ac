package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Issued tokens are signed, not stored. A token carries its expiry and a
// random nonce, and a MAC over both and the scope it was issued to, under a
// secret every instance shares. Issuing one therefore writes nothing: the
// token endpoint is anonymous by nature (a form page needs a token before
// anyone logs in), and a flood of token requests, with or without cookies,
// cannot take the memory that claims need. A claim checks the MAC before
// it asks Redis, so a forged or foreign token costs no round trip of its
// own (tokens no secret here signed make the secret be read again, once a
// second at most: refresh); a genuine one past its expiry costs one, its
// record being looked up; the
// claim's record is what marks a token spent, and it
// lives at least as long as the token (keys.lifetime), so a spent token can
// never be spent again. A release deletes the record,
// which gives the token back until it expires.
//
// The secret is WithTokenSecret's, or else one made once per key prefix
// and kept in Redis (PREFIX:token-secret), so that every instance on the
// same Redis shares it with no configuration. An instance reads it once
// (a read, so a full Redis does not stop a new instance from issuing) and
// asks again every secretRecheck, in the background: issuing and checking
// never wait on Redis while a secret is in memory, and a failed read is
// remembered for secretRetry, so a stalled Redis is not asked per request.
//
// The fleet's secret does not change by itself. When an instance finds the
// key gone (a Redis restart without persistence, an eviction, a delete) it
// writes back the secret it holds, so that tokens out, and the records of
// tokens spent meanwhile, keep meaning what they meant. An instance that
// finds another secret than its own (a new instance made one before any
// wrote theirs back, or an operator overwrote the key to revoke every token
// out) adopts it and retires its own, in Redis too, where every instance
// reads the retired secrets at its recheck: a token signed by a retired
// secret is never spent any more, but a spent one still finds its record
// (replayed, or waited for while it runs), on any instance once both have
// rechecked. And a token is spent only while Redis keeps its secret
// (tokenconfirm.go), so that no record outlives every secret that could
// find it.

const (
	tokenNonceBytes = 16
	tokenMACBytes   = 16
	tokenBytes      = 8 + tokenNonceBytes + tokenMACBytes
	// TokenLength is the length of an issued token: URL-safe base64, no
	// padding.
	tokenLength = (tokenBytes*8 + 5) / 6
	// minTokenSecret is the shortest secret WithTokenSecret accepts.
	minTokenSecret = 32
)

var strictBase64 = base64.RawURLEncoding.Strict()

// secretRecheck is how often a token signer asks Redis whether the shared
// secret changed, in the background; secretRetry how long a failed read is
// remembered before Redis is asked again.
const (
	secretRecheck = 10 * time.Second
	secretRetry   = time.Second
)

// tokenSigner signs and checks tokens under one secret.
type tokenSigner struct {
	prefix  string
	client  redis.UniversalClient
	timeout time.Duration
	logger  *slog.Logger
	// keepRetired is how long a retired secret is kept, in Redis and in
	// memory: as long as a record of a token it signed may live.
	keepRetired time.Duration

	mu      sync.Mutex
	secret  []byte          // nil until loaded
	retired []retiredSecret // earlier shared secrets, newest first
	shared  bool            // the secret is the one kept in Redis
	checked time.Time
	// read is when the last read of the fleet's secrets that succeeded
	// started: one that started after a token was checked saw every
	// secret the fleet had then (refresh).
	read time.Time
	// refreshed is when a token no secret here signed last made a read
	// start, and waiters how many such tokens wait for one (refresh).
	refreshed time.Time
	waiters   atomic.Int32
	failed    time.Time // when a read last failed, and why
	failure   error
	loading   chan struct{} // closed when the read in flight ends; nil when none is
}

// sign returns a new token for scope, valid until expires.
func (s *tokenSigner) sign(ctx context.Context, scope string, expires time.Time) (string, error) {
	secret, err := s.key(ctx)
	if err != nil {
		return "", err
	}
	var b [tokenBytes]byte
	binary.BigEndian.PutUint64(b[:8], uint64(expires.UnixMilli()))
	if _, err := rand.Read(b[8 : 8+tokenNonceBytes]); err != nil {
		return "", err
	}
	copy(b[8+tokenNonceBytes:], tokenMAC(secret, s.prefix, scope, b[:8+tokenNonceBytes]))
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// check reports whether token was issued to scope, under which secret,
// and when it expires. Expiry is the caller's to judge: a spent token past
// it is still answered from its record (see tokencheck.go). A token that
// is not one of ours at all is refused before the secret is needed.
func (s *tokenSigner) check(ctx context.Context, scope, token string) (tokenCheck, error) {
	var b [tokenBytes]byte
	if len(token) != tokenLength {
		return tokenCheck{}, nil
	}
	// Strict: the last character's unused bits must be zero. Otherwise 16
	// spellings would decode to one token, and each, naming a record of its
	// own, could be spent once.
	if n, err := strictBase64.Decode(b[:], []byte(token)); err != nil || n != tokenBytes {
		return tokenCheck{}, nil
	}
	expires := time.UnixMilli(int64(binary.BigEndian.Uint64(b[:8])))
	secret, shared, err := s.current(ctx)
	if err != nil {
		return tokenCheck{}, err
	}
	head, mac := b[:8+tokenNonceBytes], b[8+tokenNonceBytes:]
	if hmac.Equal(mac, tokenMAC(secret, s.prefix, scope, head)) {
		ok := tokenCheck{expires: expires, state: tokenValid}
		if shared {
			ok.shared = secret
		}
		return ok, nil
	}
	for _, old := range s.retiredSecrets() {
		if hmac.Equal(mac, tokenMAC(old.secret, s.prefix, scope, head)) {
			return tokenCheck{expires: expires, state: tokenRetired}, nil
		}
	}
	return tokenCheck{}, nil
}

// tokenCheck is what check found out about a token.
type tokenCheck struct {
	expires time.Time
	state   tokenState
	// shared is the secret kept in Redis that signed a valid token: a
	// spend of the token first makes sure Redis still keeps it (confirm).
	// Nil under WithTokenSecret's secret, which no instance can lose.
	shared []byte
}

// tokenState is what check found a token to be.
type tokenState int

const (
	tokenInvalid tokenState = iota // not issued to this scope
	tokenValid
	// tokenRetired: issued to this scope under a secret the fleet no
	// longer holds. It is never spent any more; if it was, its record
	// answers.
	tokenRetired
)

// retiredSecret is a secret the fleet signed with and no longer does, and
// when it was retired: a record of a token it signed may live until
// keepRetired after that, and the secret is kept as long.
type retiredSecret struct {
	secret []byte
	since  time.Time
}

func (s *tokenSigner) retiredSecrets() []retiredSecret {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
}

// tokenMAC binds a token's expiry and nonce to its scope and to the key
// prefix whose records mark tokens spent: two middlewares that share a
// secret under two prefixes never accept each other's tokens, which each
// would spend once.
func tokenMAC(secret []byte, prefix, scope string, head []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("idempotency/token\x00"))
	mac.Write([]byte(prefix))
	mac.Write([]byte{0})
	mac.Write([]byte(scope))
	mac.Write([]byte{0})
	mac.Write(head)
	return mac.Sum(nil)[:tokenMACBytes]
}

// key returns the secret. With one in memory it never waits: when the
// shared secret is due for a recheck, a read starts in the background.
// Without one, the callers share one read, and a failed read is answered
// from memory until secretRetry has passed.
func (s *tokenSigner) key(ctx context.Context) ([]byte, error) {
	secret, _, err := s.current(ctx)
	return secret, err
}

// current is key, and whether the secret is the one kept in Redis.
func (s *tokenSigner) current(ctx context.Context) (secret []byte, shared bool, err error) {
	s.mu.Lock()
	if s.secret != nil {
		if s.shared && time.Since(s.checked) >= secretRecheck && s.loading == nil && time.Since(s.failed) >= secretRetry {
			s.startLoad()
		}
		secret, shared := s.secret, s.shared
		s.mu.Unlock()
		return secret, shared, nil
	}
	if time.Since(s.failed) < secretRetry {
		err := s.failure
		s.mu.Unlock()
		return nil, false, err
	}
	if s.loading == nil {
		s.startLoad()
	}
	loading := s.loading
	s.mu.Unlock()
	select {
	case <-loading:
	case <-ctx.Done():
		return nil, false, unavailable(ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secret == nil {
		return nil, false, s.failure
	}
	return s.secret, s.shared, nil
}

// startLoad starts a read of the shared secret; s.mu is held.
func (s *tokenSigner) startLoad() {
	done := make(chan struct{})
	s.loading = done
	held := s.secret
	started := time.Now()
	go func() {
		secret, err := s.load(held)
		var retired []retiredSecret
		if err == nil {
			if held != nil && !hmac.Equal(held, secret) {
				s.retire(held)
			}
			retired = s.loadRetired()
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.loading = nil
		close(done)
		if err != nil {
			s.failed, s.failure = time.Now(), err
			if errors.Is(err, errShortSecret) {
				s.logger.Error("idempotency: the shared token secret in Redis (" + s.secretKey() + ") is shorter " +
					"than 32 bytes; no token is spent until it is replaced by 32 or more random bytes")
			}
			return
		}
		s.use(secret, retired)
		s.read, s.failed, s.failure = started, time.Time{}, nil
	}()
}

// use makes secret, the one Redis keeps, the one this instance signs
// with, and fresh (retired secrets just read from Redis) among those it
// looks spent tokens up with; the secret it held until now joins them.
// s.mu is held.
func (s *tokenSigner) use(secret []byte, fresh []retiredSecret) {
	now := time.Now()
	if s.secret != nil && !hmac.Equal(s.secret, secret) {
		s.logger.Warn("idempotency: the shared token secret in Redis changed; tokens of the old one are " +
			"no longer spent (a spent one still replays)")
		fresh = append(fresh, retiredSecret{secret: s.secret, since: now})
	}
	s.retired = mergeSecrets(fresh, s.retired, secret, now.Add(-s.keepRetired))
	s.secret, s.shared, s.checked = secret, true, now
}

// retire records a secret this instance held and the fleet no longer
// does (PREFIX:token-secret:retired), so that every instance, a new one
// that never held it included, can still find the records of the tokens
// it signed. Kept as long as such a record lives.
func (s *tokenSigner) retire(old []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := s.record(ctx, old); err != nil {
		s.logger.Warn("idempotency: could not record a retired token secret; other instances may answer "+
			"its spent tokens token-not-found", "error", err)
	}
}

// The fleet's retired secrets are a sorted set (PREFIX:token-secret:retired),
// each scored with when it was last retired, in Unix milliseconds. Each is
// kept for keepRetired after that, however many secrets came and went
// meanwhile: a count would drop the secret of a token whose record lives
// once the key was replaced often enough, and the token's resubmission,
// told token-not-found, would make the form order again. The set only ever
// holds the secrets of the last keepRetired, which a token that no secret
// here signed is checked against in memory.

// record adds secret to the fleet's retired secrets, retired now, and drops
// those whose tokens' records have all expired.
func (s *tokenSigner) record(ctx context.Context, secret []byte) error {
	name := s.prefix + ":token-secret:retired"
	now := time.Now()
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAddGT(ctx, name, redis.Z{Score: float64(now.UnixMilli()), Member: secret})
		p.ZRemRangeByScore(ctx, name, "-inf", "("+unixMilli(now.Add(-s.keepRetired)))
		p.PExpire(ctx, name, s.keepRetired)
		return nil
	})
	return err
}

// loadRetired reads the fleet's retired secrets that are still kept; nil
// when Redis does not answer (the next recheck asks again).
func (s *tokenSigner) loadRetired() []retiredSecret {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	members, err := s.client.ZRangeByScoreWithScores(ctx, s.prefix+":token-secret:retired", &redis.ZRangeBy{
		Min: unixMilli(time.Now().Add(-s.keepRetired)),
		Max: "+inf",
	}).Result()
	if err != nil {
		return nil
	}
	retired := make([]retiredSecret, 0, len(members))
	for _, m := range members {
		if secret, ok := m.Member.(string); ok && len(secret) >= minTokenSecret {
			retired = append(retired, retiredSecret{secret: []byte(secret), since: time.UnixMilli(int64(m.Score))})
		}
	}
	return retired
}

func unixMilli(t time.Time) string {
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// mergeSecrets is the retired secrets of fresh and held, without current,
// each once (with the later of its times), none retired before oldest;
// newest first, where a token of a secret just replaced finds its own.
func mergeSecrets(fresh, held []retiredSecret, current []byte, oldest time.Time) []retiredSecret {
	var out []retiredSecret
	for _, r := range append(fresh, held...) {
		if hmac.Equal(r.secret, current) || r.since.Before(oldest) {
			continue
		}
		i := slices.IndexFunc(out, func(o retiredSecret) bool { return hmac.Equal(o.secret, r.secret) })
		switch {
		case i < 0:
			out = append(out, r)
		case r.since.After(out[i].since):
			out[i].since = r.since
		}
	}
	slices.SortFunc(out, func(a, b retiredSecret) int { return b.since.Compare(a.since) })
	return out
}

// load reads the secret Redis keeps. When there is none, it writes the one
// this instance holds (held), or a new one when it holds none: whichever
// instance writes first, every instance ends up with that one.
func (s *tokenSigner) load(held []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	secret, err := s.client.Get(ctx, s.secretKey()).Bytes()
	if errors.Is(err, redis.Nil) {
		writeBack := held != nil
		if !writeBack {
			held = make([]byte, minTokenSecret)
			if _, err := rand.Read(held); err != nil {
				return nil, err
			}
		}
		var ours bool
		if secret, ours, err = s.put(ctx, held, writeBack); ours {
			return held, nil
		}
	}
	switch {
	case err != nil:
		return nil, unavailable(err)
	case len(secret) < minTokenSecret:
		return nil, unavailable(errShortSecret)
	}
	return secret, nil
}
