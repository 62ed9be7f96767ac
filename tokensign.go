package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Issued tokens are signed, not stored. A token carries its expiry and a
// random nonce, and a MAC over both and the scope it was issued to, under a
// secret every instance shares. Issuing one therefore writes nothing: the
// token endpoint is anonymous by nature (a form page needs a token before
// anyone logs in), and a flood of token requests, with or without cookies,
// cannot take the memory that claims need. A claim checks the MAC and the
// expiry before it asks Redis, so a forged, expired or foreign token costs
// no round trip; the claim's record is what marks a token spent, and it
// lives at least as long as the token (keys.lifetime), so a spent token can
// never be spent again. A release deletes the record,
// which gives the token back until it expires.
//
// The secret is WithTokenSecret's, or else one made once per key prefix
// and kept in Redis (PREFIX:token-secret), so that every instance on the
// same Redis shares it with no configuration. Deleting that key revokes
// every token out: the next instance to need the secret makes a new one,
// and the others adopt it within secretRecheck.

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
// secret changed (someone deleted it, and an instance made a new one):
// until it asks, it refuses tokens of the new secret and signs with the
// old one. One round trip per instance in that time.
const secretRecheck = 10 * time.Second

// tokenSigner signs and checks tokens under one secret.
type tokenSigner struct {
	prefix  string
	client  redis.UniversalClient
	timeout time.Duration

	mu      sync.Mutex
	secret  []byte    // nil until loaded
	shared  bool      // the secret is the one kept in Redis
	checked time.Time // when Redis last said what the shared secret is
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

// check reports whether token was issued to scope under this secret and
// has not expired by now, and when it expires. A token that is not one of
// ours at all is refused before the secret is needed.
func (s *tokenSigner) check(ctx context.Context, scope, token string, now time.Time) (expires time.Time, ok bool, err error) {
	var b [tokenBytes]byte
	if len(token) != tokenLength {
		return time.Time{}, false, nil
	}
	// Strict: the last character's unused bits must be zero. Otherwise 16
	// spellings would decode to one token, and each, naming a record of its
	// own, could be spent once.
	if n, err := strictBase64.Decode(b[:], []byte(token)); err != nil || n != tokenBytes {
		return time.Time{}, false, nil
	}
	expires = time.UnixMilli(int64(binary.BigEndian.Uint64(b[:8])))
	if !now.Before(expires) {
		return time.Time{}, false, nil
	}
	secret, err := s.key(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	return expires, hmac.Equal(b[8+tokenNonceBytes:], tokenMAC(secret, s.prefix, scope, b[:8+tokenNonceBytes])), nil
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

// key returns the secret, loading (or first making) the shared one from
// Redis when it has none, and asking again every secretRecheck. A failure
// is not remembered: the next call asks again, and meanwhile the secret
// already read stays in use.
func (s *tokenSigner) key(ctx context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secret != nil && (!s.shared || time.Since(s.checked) < secretRecheck) {
		return s.secret, nil
	}
	old, err := s.load(ctx)
	if err != nil && s.secret == nil {
		return nil, err
	}
	if err == nil {
		s.secret, s.shared, s.checked = old, true, time.Now()
	}
	return s.secret, nil
}

// load returns the secret Redis keeps, making it first if there is none.
func (s *tokenSigner) load(ctx context.Context) ([]byte, error) {
	fresh := make([]byte, minTokenSecret)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	name := s.prefix + ":token-secret"
	// SET NX … GET answers the secret that was there, or nil when ours
	// went in: one round trip, and every instance ends up with the first.
	old, err := s.client.SetArgs(ctx, name, fresh, redis.SetArgs{Mode: "NX", Get: true}).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return fresh, nil
	case err != nil:
		return nil, unavailable(err)
	case len(old) < minTokenSecret:
		return nil, unavailable(errors.New("the shared token secret in Redis is too short"))
	}
	return old, nil
}
