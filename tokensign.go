package idempotency

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"time"
)

// Issued tokens are signed, not stored. A token carries its expiry and a
// random nonce, and a MAC over both and the scope it was issued to, under
// the key ring's signing key (TokenKeys). Issuing one therefore writes
// nothing: the token endpoint is anonymous by nature (a form page needs a
// token before anyone logs in), and a flood of token requests, with or
// without cookies, cannot take the memory that claims need.
//
// A claim checks the MAC against the ring before it asks Redis, so a
// forged or foreign token costs no round trip, and no secret is ever read
// from or written to Redis: the ring is configuration, which a Redis that
// restarts empty cannot take away. A genuine token past its expiry costs
// one round trip, its record being looked up. The claim's record is what
// marks a token spent, and it lives at least as long as the token
// (keys.lifetime), so a spent token can never be spent again. A release
// deletes the record, which gives the token back until it expires.

const (
	tokenNonceBytes = 16
	tokenMACBytes   = 16
	tokenBytes      = 8 + tokenNonceBytes + tokenMACBytes
	// tokenLength is the length of an issued token: URL-safe base64, no
	// padding.
	tokenLength = (tokenBytes*8 + 5) / 6
)

var strictBase64 = base64.RawURLEncoding.Strict()

// tokenSigner signs and checks tokens under a key ring.
type tokenSigner struct {
	prefix string
	keys   TokenKeys
}

// sign returns a new token for scope, valid until expires.
func (s *tokenSigner) sign(scope string, expires time.Time) (string, error) {
	var b [tokenBytes]byte
	binary.BigEndian.PutUint64(b[:8], uint64(expires.UnixMilli()))
	if _, err := rand.Read(b[8 : 8+tokenNonceBytes]); err != nil {
		return "", err
	}
	copy(b[8+tokenNonceBytes:], tokenMAC(s.keys.Sign, s.prefix, scope, b[:8+tokenNonceBytes]))
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// check reports whether token was issued to scope, what its key may still
// do, and when it expires. Expiry is the caller's to judge: a spent token
// past it is still answered from its record (see tokencheck.go).
func (s *tokenSigner) check(scope, token string) tokenCheck {
	var b [tokenBytes]byte
	if len(token) != tokenLength {
		return tokenCheck{}
	}
	// Strict: the last character's unused bits must be zero. Otherwise 16
	// spellings would decode to one token, and each, naming a record of its
	// own, could be spent once.
	if n, err := strictBase64.Decode(b[:], []byte(token)); err != nil || n != tokenBytes {
		return tokenCheck{}
	}
	head, mac := b[:8+tokenNonceBytes], b[8+tokenNonceBytes:]
	signed := func(key []byte) bool { return hmac.Equal(mac, tokenMAC(key, s.prefix, scope, head)) }
	expires := time.UnixMilli(int64(binary.BigEndian.Uint64(b[:8])))
	if signed(s.keys.Sign) {
		return tokenCheck{expires: expires, state: tokenValid}
	}
	for _, key := range s.keys.Accept {
		if signed(key) {
			return tokenCheck{expires: expires, state: tokenValid}
		}
	}
	for _, key := range s.keys.Revoked {
		if signed(key) {
			return tokenCheck{expires: expires, state: tokenRevoked}
		}
	}
	return tokenCheck{}
}

// tokenCheck is what check found out about a token.
type tokenCheck struct {
	expires time.Time
	state   tokenState
}

// tokenState is what check found a token to be.
type tokenState int

const (
	tokenInvalid tokenState = iota // no key of the ring signed it for this scope
	tokenValid                     // signed by a key that spends (Sign, Accept)
	// tokenRevoked: signed by a revoked key. It is never spent any more;
	// if it was, its record answers.
	tokenRevoked
)

// tokenMAC binds a token's expiry and nonce to its scope and to the key
// prefix whose records mark tokens spent: two middlewares that share a
// key under two prefixes never accept each other's tokens, which each
// would spend once.
func tokenMAC(key []byte, prefix, scope string, head []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("idempotency/token\x00"))
	mac.Write([]byte(prefix))
	mac.Write([]byte{0})
	mac.Write([]byte(scope))
	mac.Write([]byte{0})
	mac.Write(head)
	return mac.Sum(nil)[:tokenMACBytes]
}
