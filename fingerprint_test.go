package idempotency

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"
)

func fpRequest(method, target, body string, header ...string) (*http.Request, []byte) {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r, []byte(body)
}

func sameFingerprint(f Fingerprinter, a, b func() (*http.Request, []byte)) bool {
	ra, ba := a()
	rb, bb := b()
	return string(f(ra, ba)) == string(f(rb, bb))
}

func TestFingerprinters(t *testing.T) {
	req := func(method, target, body string, header ...string) func() (*http.Request, []byte) {
		return func() (*http.Request, []byte) { return fpRequest(method, target, body, header...) }
	}
	reordered := [2]func() (*http.Request, []byte){
		req("POST", "/p?b=2&a=1", `{"amount":500,"currency":"EUR","meta":{"y":1,"x":2}}`),
		req("POST", "/p?a=1&b=2", "{ \"meta\": {\"x\":2,\"y\":1}, \"currency\":\"EUR\", \"amount\":5e2 }"),
	}
	require.False(t, sameFingerprint(DefaultFingerprint, reordered[0], reordered[1]))
	require.True(t, sameFingerprint(CanonicalJSON, reordered[0], reordered[1]))
	require.False(t, sameFingerprint(CanonicalJSON, req("POST", "/p", `{"amount":500}`), req("POST", "/p", `{"amount":501}`)))
	require.False(t, sameFingerprint(CanonicalJSON, req("POST", "/p", `{}`), req("PUT", "/p", `{}`)))

	require.True(t, sameFingerprint(CanonicalQuery, req("GET", "/s?b=2&a=1", ""), req("GET", "/s?a=1&b=2", "")))
	require.False(t, sameFingerprint(CanonicalQuery, req("GET", "/s?a=1&a=2", ""), req("GET", "/s?a=2&a=1", "")),
		"the order of one name's values counts")

	fields := JSONFields("amount", "payment.currency")
	require.True(t, sameFingerprint(fields,
		req("POST", "/p", `{"amount":5,"payment":{"currency":"EUR"},"sent_at":"10:00"}`),
		req("POST", "/p", `{"sent_at":"10:01","payment":{"currency":"EUR","note":"x"},"amount":5.0}`)))
	require.False(t, sameFingerprint(fields,
		req("POST", "/p", `{"amount":5,"payment":{"currency":"EUR"}}`),
		req("POST", "/p", `{"amount":5,"payment":{"currency":"USD"}}`)))
	require.True(t, sameFingerprint(fields, req("POST", "/p", `{"amount":5}`), req("POST", "/p", `{"amount":5,"payment":{}}`)),
		"a field absent either way")
	require.False(t, sameFingerprint(fields, req("POST", "/p", `{"amount":5}`), req("POST", "/p", `{"amount":5,"payment":{"currency":null}}`)),
		"absent is not null")

	versioned := WithHeaders(CanonicalJSON, "api-version")
	require.True(t, sameFingerprint(versioned, req("POST", "/p", `{}`, "Api-Version", "2"), req("POST", "/p", `{}`, "API-VERSION", "2")))
	require.False(t, sameFingerprint(versioned, req("POST", "/p", `{}`, "Api-Version", "2"), req("POST", "/p", `{}`, "Api-Version", "3")))

	r, body := fpRequest("POST", "/p?x=1", `{"a":1}`)
	require.Equal(t, fingerprint(r, body), (&config{fingerprinter: DefaultFingerprint}).fingerprintOf(r, body),
		"DefaultFingerprint is the built-in fingerprint")
}

// With canonical JSON a retry that reorders its JSON replays; without it the
// same retry is a different request.
func TestCanonicalJSONReplaysAReorderedRetry(t *testing.T) {
	s := newShop(t, WithFingerprint(CanonicalJSON))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "jcs", `{"amount":500,"currency":"EUR"}`).status)
	again := s.post(c, "/payments", "jcs", `{"currency": "EUR", "amount": 500}`)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())

	plain := newShop(t)
	require.Equal(t, http.StatusCreated, plain.post(c, "/payments", "raw", `{"amount":500,"currency":"EUR"}`).status)
	requireProblem(t, plain.post(c, "/payments", "raw", `{"currency": "EUR", "amount": 500}`), 422, "key-reused")
}

func FuzzCanonicalizers(f *testing.F) {
	f.Add(`{"b":1,"a":[1,2,{"d":null,"c":"\u00e9"}]}`, "b=2&a=1&a=0")
	f.Add(`not json`, "%zz")
	f.Add(`{"amount":1e400}`, "")
	f.Fuzz(func(t *testing.T, body, query string) {
		r := httptest.NewRequest(http.MethodPost, "/p", strings.NewReader(body))
		r.URL.RawQuery = query
		for _, fp := range []Fingerprinter{CanonicalJSON, CanonicalQuery, JSONFields("a", "b.c"), WithHeaders(DefaultFingerprint, "X")} {
			first := fp(r, []byte(body))
			require.Equal(t, first, fp(r, []byte(body)), "deterministic")
		}
		// Canonical JSON is a fixed point: canonicalizing it again changes
		// nothing.
		if once, err := jcs.Transform([]byte(body)); err == nil {
			twice, err := jcs.Transform(once)
			require.NoError(t, err)
			require.Equal(t, once, twice)
		}
	})
}
