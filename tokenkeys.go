package idempotency

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// TokenKeys is the key ring that issued tokens are signed and checked
// with: configuration, the same on every instance, kept where the
// application keeps its other secrets (an environment variable, a secret
// store). Each key is at least 32 random bytes.
//
// A key's role decides what its tokens may still do:
//
//   - Sign signs every new token, and spends the tokens it signed;
//   - each of Accept spends the tokens it signed, and signs none: the key
//     of a rotation in progress, coming or going;
//   - each of Revoked spends nothing any more, but a token it signed that
//     was spent still finds its record, and replays its answer (or waits
//     for it while it runs).
//
// A token no key of the ring signed is refused as unknown at once,
// without Redis (422 token-not-found), and so is one of a revoked key that
// was never spent: nothing ran for it, and nothing ever will while its key
// stays revoked or leaves the ring. A key leaves the ring only once every
// record of its tokens has expired: the record TTL plus the token TTL
// after it last signed or spent (docs/operations.md, "Token keys").
type TokenKeys struct {
	Sign    []byte
	Accept  [][]byte
	Revoked [][]byte
}

// minTokenKey is the shortest key a ring accepts.
const minTokenKey = 32

// WithTokenKeys sets the key ring that issued tokens are signed and checked
// with (TokenKeys). Without it, or WithTokenSecret, each process signs with
// a random key of its own, and the first Protect or IssueToken logs a
// warning: the tokens it issues are refused by every other instance and
// after a restart. New panics when the ring has no Sign key (an empty ring
// or a nil secret, as a failed load of the configuration gives), or a key
// is shorter than 32 bytes or appears twice.
func WithTokenKeys(keys TokenKeys) Option {
	return func(c *config) { c.tokenKeys, c.tokenKeysSet = keys.clone(), true }
}

// WithTokenSecret sets the one key issued tokens are signed with: the same
// as WithTokenKeys(TokenKeys{Sign: secret}).
func WithTokenSecret(secret []byte) Option {
	return WithTokenKeys(TokenKeys{Sign: secret})
}

// ParseTokenKeys reads a key ring written as space-separated role=key
// pairs, each key in standard or URL-safe base64 (with or without
// padding), as an environment variable holds one:
//
//	sign=<key> accept=<key> revoked=<key> revoked=<key>
//
// Exactly one sign is required; accept and revoked may repeat. An error
// names a malformed field by its place, never by its text, which may hold
// a key.
func ParseTokenKeys(s string) (TokenKeys, error) {
	var ring TokenKeys
	for i, field := range strings.Fields(s) {
		role, text, ok := strings.Cut(field, "=")
		if !ok || (role != "sign" && role != "accept" && role != "revoked") {
			return TokenKeys{}, fmt.Errorf("idempotency: token key field %d is not sign=, accept= or revoked= "+
				"followed by a key in base64", i+1)
		}
		key, err := decodeKey(text)
		if err != nil {
			return TokenKeys{}, fmt.Errorf("idempotency: token key field %d (%s) is not base64", i+1, role)
		}
		switch role {
		case "sign":
			if ring.Sign != nil {
				return TokenKeys{}, errors.New("idempotency: two sign token keys; a ring has one")
			}
			ring.Sign = key
		case "accept":
			ring.Accept = append(ring.Accept, key)
		default:
			ring.Revoked = append(ring.Revoked, key)
		}
	}
	if ring.Sign == nil {
		return TokenKeys{}, errors.New("idempotency: no sign token key")
	}
	if err := ring.validate(); err != nil {
		return TokenKeys{}, fmt.Errorf("idempotency: %w", err)
	}
	return ring, nil
}

func decodeKey(text string) ([]byte, error) {
	text = strings.TrimRight(text, "=")
	if key, err := base64.RawStdEncoding.DecodeString(text); err == nil {
		return key, nil
	}
	return base64.RawURLEncoding.DecodeString(text)
}

// NewTokenKey returns a new random key for a TokenKeys ring, in URL-safe
// base64 as ParseTokenKeys reads it.
func NewTokenKey() string {
	return base64.RawURLEncoding.EncodeToString(randomKey())
}

func randomKey() []byte {
	key := make([]byte, minTokenKey)
	rand.Read(key) // never fails (crypto/rand)
	return key
}

// processKey is the signing key of a process whose Middlewares were given
// none: drawn once, so that every Middleware of the process accepts the
// tokens of every other.
var processKey = sync.OnceValue(randomKey)

func (k TokenKeys) clone() TokenKeys {
	c := TokenKeys{Sign: bytes.Clone(k.Sign)}
	for _, a := range k.Accept {
		c.Accept = append(c.Accept, bytes.Clone(a))
	}
	for _, r := range k.Revoked {
		c.Revoked = append(c.Revoked, bytes.Clone(r))
	}
	return c
}

// validate refuses short keys, a ring without a signing key, and a key in
// two places (a key both accepted and revoked would mean two things).
func (k TokenKeys) validate() error {
	if len(k.Sign) == 0 {
		return errors.New("the token key ring has no Sign key")
	}
	seen := make(map[string]string)
	check := func(role string, key []byte) error {
		if len(key) < minTokenKey {
			return fmt.Errorf("a %s token key of %d bytes is shorter than %d", role, len(key), minTokenKey)
		}
		if other, dup := seen[string(key)]; dup {
			return fmt.Errorf("a token key is both %s and %s", other, role)
		}
		seen[string(key)] = role
		return nil
	}
	if err := check("Sign", k.Sign); err != nil {
		return err
	}
	for _, a := range k.Accept {
		if err := check("Accept", a); err != nil {
			return err
		}
	}
	for _, r := range k.Revoked {
		if err := check("Revoked", r); err != nil {
			return err
		}
	}
	return nil
}
