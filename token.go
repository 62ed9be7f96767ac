package idempotency

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
)

// A Token is an issued one-time token and how long it stays valid.
type Token struct {
	Value     string
	ExpiresIn time.Duration
}

// IssueToken issues a token bound to the caller's scope. With the default
// scope it starts a session first when the caller has none: the session
// cookie is set on w, and r is updated so that later calls in the same
// request (a page with two forms) join the same session.
func (m *Middleware) IssueToken(w http.ResponseWriter, r *http.Request) (Token, error) {
	scope, err := m.issuingScope(w, r)
	if err != nil {
		return Token{}, err
	}
	return m.IssueTokenFor(r, scope)
}

// IssueTokenFor issues a token bound to an explicit scope, for callers that
// know it (a background job, a test). The token is only accepted from
// requests whose scope function returns the same scope. Issuing writes
// nothing to Redis (see tokensign.go).
func (m *Middleware) IssueTokenFor(r *http.Request, scope string) (Token, error) {
	token, err := m.tokens.sign(scope, time.Now().Add(m.cfg.tokenTTL))
	if err != nil {
		return Token{}, err
	}
	m.signers.signed()
	return Token{Value: token, ExpiresIn: m.cfg.tokenTTL}, nil
}

// FormField issues a token and returns the hidden input that carries it, for
// a server-rendered form: {{ .IdempotencyField }}. Serve such pages with
// Cache-Control: private, no-cache rather than no-store: a browser then
// shows the submitted form again on Back, token included, and submitting it
// again is recognised as a duplicate instead of placing a second order.
func (m *Middleware) FormField(w http.ResponseWriter, r *http.Request) (template.HTML, error) {
	t, err := m.IssueToken(w, r)
	if err != nil {
		return "", err
	}
	return template.HTML(`<input type="hidden" name="` + template.HTMLEscapeString(m.cfg.formField) +
		`" value="` + t.Value + `">`), nil
}

// TokenHandler answers GET (or POST) with a fresh token as JSON:
//
//	{"token": "…", "expires_in": 3600}
//
// setting the session cookie when the caller has none.
func (m *Middleware) TokenHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodPost {
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		t, err := m.IssueToken(w, r)
		if err != nil {
			m.cfg.errorHandler(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(struct {
			Token     string `json:"token"`
			ExpiresIn int64  `json:"expires_in"`
		}{t.Value, int64(t.ExpiresIn / time.Second)})
	})
}

// issuingScope is the scope a new token is bound to, starting a session when
// the default scope is in use and the caller has none. A session cookie
// the caller has already is never replaced, whatever its value: it may be
// the application's own (see sessionScope).
func (m *Middleware) issuingScope(w http.ResponseWriter, r *http.Request) (string, error) {
	if m.cfg.scope != nil {
		return m.customScope(r)
	}
	if sessions := m.sessions(r); len(sessions) > 0 {
		return sessions[0], nil
	}
	if value := startedCookie(w.Header(), m.cfg.sessionCookie); value != "" {
		// The application started its session on this response (a session
		// layer outside, on a first visit): the token is bound to it, and
		// a cookie of ours would replace it in the browser.
		r.AddCookie(&http.Cookie{Name: m.cfg.sessionCookie, Value: value})
		return sessionScope(value), nil
	}
	session := uuid.NewString()
	http.SetCookie(w, &http.Cookie{
		Name:     m.cfg.sessionCookie,
		Value:    session,
		Path:     "/",
		HttpOnly: true,
		Secure:   m.secureCookie(r),
		SameSite: http.SameSiteLaxMode,
	}) // Path=/ and no Domain, as a __Host- name requires
	r.AddCookie(&http.Cookie{Name: m.cfg.sessionCookie, Value: session})
	return session, nil
}

// startedCookie is the value of the cookie name that header sets at Path=/,
// where the middleware would set its own: the last such line (the one a
// browser keeps), or "" when none sets it there, or the last removes it.
// Lines for other paths (one that clears a cookie left on an old path)
// name other cookies in the browser, and are not the session of the
// pages a token is issued to.
func startedCookie(header http.Header, name string) string {
	lines := header["Set-Cookie"]
	for i := len(lines) - 1; i >= 0; i-- {
		c, err := http.ParseSetCookie(lines[i])
		if err != nil || c.Name != name || c.Path != "/" {
			continue
		}
		// A browser obeys Max-Age over Expires (RFC 6265 §5.3):
		// net/http reads Max-Age=0 or less as -1.
		removed := c.MaxAge < 0 || (c.MaxAge == 0 && !c.Expires.IsZero() && c.Expires.Before(time.Now()))
		if c.Value == "" || removed {
			return ""
		}
		return c.Value
	}
	return ""
}

// prefixedCookie reports whether a cookie name carries a prefix that
// browsers enforce: __Secure- (Secure) or __Host- (Secure, Path=/, no
// Domain).
func prefixedCookie(name string) bool {
	return strings.HasPrefix(name, "__Secure-") || strings.HasPrefix(name, "__Host-")
}

func (m *Middleware) customScope(r *http.Request) (string, error) {
	scope, err := m.cfg.scope(r)
	if err != nil || scope == "" {
		return "", ErrNoScope
	}
	return scope, nil
}

// secureCookie reports whether the session cookie is sent with Secure. A
// prefixed name (__Secure-, __Host-) always is: a browser refuses such a
// cookie without it, also when TLS ended at a proxy and the request
// reached the application over plain HTTP.
func (m *Middleware) secureCookie(r *http.Request) bool {
	if prefixedCookie(m.cfg.sessionCookie) {
		return true
	}
	if m.cfg.secureCookieSet {
		return m.cfg.secureCookie
	}
	return r.TLS != nil
}

// isSession accepts exactly the canonical form of a session id (a version
// 4 UUID, as issuingScope draws it): only such a value is a scope as it
// is, and no other spelling of it names the same scope.
func isSession(s string) bool {
	// At 36 bytes uuid.Parse accepts only the hyphenated form; what it
	// tolerates beyond the canonical one is upper-case hex.
	if len(s) != 36 || strings.ContainsAny(s, "ABCDEF") {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}
