package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
)

// tokenScope finds the scope that token (an issued one) was issued to
// among the caller's: the scope function's answer, or else the session
// cookies the request carries (the first maxSessionCookies distinct ones). A browser sends every cookie of the name
// whose domain and path match, and one of them may have been planted (by
// a sibling subdomain, or a network attacker over plain HTTP, with a more
// specific path, so that it comes first): a token bound to any of them is
// the caller's, so that a planted cookie cannot make the genuine tokens
// unknown.
//
// A token that is unknown, forged or another scope's is refused here,
// before Redis is asked, and all alike. One past its expiry is not: it may
// have been spent, and its record then answers (a replay, or a wait while
// it runs); the claim refuses it only when nothing was recorded
// (ErrTokenExpired).
func (m *Middleware) tokenScope(c *call, token string) error {
	var scopes []string
	if m.cfg.scope != nil {
		scope, err := m.customScope(c.r)
		if err != nil {
			return err
		}
		scopes = []string{scope}
	} else {
		scopes = m.sessions(c.r)
	}
	for _, scope := range scopes {
		if got := m.tokens.check(scope, token); got.state != tokenInvalid {
			c.scope, c.tokenExpires = scope, got.expires
			c.lookupOnly = got.state == tokenRevoked
			return nil
		}
	}
	// Without a session a token cannot be anyone's, which is answered like
	// any unknown token.
	return ErrTokenNotFound
}

// sessions are the scopes of every non-empty session cookie of the
// request, in order.
// Each value is checked against every key of the ring, so a request that
// repeats the cookie thousands of times would cost as many digests: values
// are taken once each, and no more than maxSessionCookies of them (a
// browser sends one per domain and path that set it).
func (m *Middleware) sessions(r *http.Request) []string {
	if len(r.Header["Cookie"]) == 0 { // skip parsing what is not there
		return nil
	}
	var values []string
	for _, c := range r.CookiesNamed(m.cfg.sessionCookie) {
		if c.Value == "" || slices.Contains(values, c.Value) {
			continue
		}
		if values = append(values, c.Value); len(values) == maxSessionCookies {
			break
		}
	}
	for i, v := range values {
		values[i] = sessionScope(v)
	}
	return values
}

// maxSessionCookies is how many distinct session cookies of one request
// are tried as the token's scope.
const maxSessionCookies = 16

// sessionScope is the scope a session cookie's value names: the value
// itself when it is a session the token endpoint started, or else a
// digest of it. WithSessionCookie may name the application's own login
// cookie, whose values the middleware never replaces (it would log the
// user out), and which need not reach anything in plain text.
func sessionScope(value string) string {
	if isSession(value) {
		return value
	}
	sum := sha256.Sum256([]byte(value))
	return "cookie " + hex.EncodeToString(sum[:])
}
