package idempotency

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

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
	require.False(t, sameFingerprint(JSONFields("p"), req("POST", "/p", `{"p":{"x":1e9999999999}}`), req("POST", "/p", `{"p":{"x":2e9999999999}}`)),
		"a number beyond any exponent counts as written")

	versioned := IncludeHeaders(CanonicalJSON, "api-version")
	require.True(t, sameFingerprint(versioned, req("POST", "/p", `{}`, "Api-Version", "2"), req("POST", "/p", `{}`, "API-VERSION", "2")))
	require.False(t, sameFingerprint(versioned, req("POST", "/p", `{}`, "Api-Version", "2"), req("POST", "/p", `{}`, "Api-Version", "3")))

	r, body := fpRequest("POST", "/p?x=1", `{"a":1}`)
	require.Equal(t, (&config{}).fingerprint(r, body, true), (&config{fingerprinter: DefaultFingerprint}).fingerprintOf(r, body, true),
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

// A browser draws a new multipart boundary for every submission, so a
// double click on a form with enctype="multipart/form-data" sends the same
// fields between other boundaries: it is the same request, and replayed.
// Another field's value, or another file, is another request.
func TestAMultipartFormResubmittedWithAnotherBoundaryIsReplayed(t *testing.T) {
	s := newShop(t)
	c := s.client()
	token := s.token(c)
	submit := func(boundary, quantity, file string) answer {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		require.NoError(t, mw.SetBoundary(boundary))
		mw.WriteField("item", "tea")
		mw.WriteField("quantity", quantity)
		mw.WriteField("idempotency_token", token)
		fw, err := mw.CreateFormFile("note", "note.txt")
		require.NoError(t, err)
		io.WriteString(fw, file)
		require.NoError(t, mw.Close())
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", &body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		return do(t, c, req)
	}
	first := submit("----WebKitFormBoundaryAAAAAAAAAAAAAAAA", "1", "ring twice")
	require.Equal(t, http.StatusCreated, first.status, first.body)

	again := submit("----WebKitFormBoundaryBBBBBBBBBBBBBBBB", "1", "ring twice")
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	require.EqualValues(t, 1, s.execs.Load())

	requireProblem(t, submit("----WebKitFormBoundaryCCCCCCCCCCCCCCCC", "2", "ring twice"), 422, "key-reused")
	requireProblem(t, submit("----WebKitFormBoundaryDDDDDDDDDDDDDDDD", "1", "ring once"), 422, "key-reused")
	require.EqualValues(t, 1, s.execs.Load())
}

// The multipart digest leaves out the boundary and nothing else: each
// part's headers and bytes, and their order, count.
func TestMultipartDigest(t *testing.T) {
	body := func(boundary string, parts ...[2]string) (string, []byte) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		require.NoError(t, mw.SetBoundary(boundary))
		for _, p := range parts {
			mw.WriteField(p[0], p[1])
		}
		require.NoError(t, mw.Close())
		return mw.FormDataContentType(), b.Bytes()
	}
	digest := func(contentType string, b []byte) string {
		sum, ok := multipartDigest(contentType, b)
		require.True(t, ok)
		return hex.EncodeToString(sum[:])
	}
	a, b := [2]string{"a", "1"}, [2]string{"b", "2"}
	want := digest(body("x1", a, b))
	require.Equal(t, want, digest(body("another-boundary", a, b)))
	require.NotEqual(t, want, digest(body("x1", b, a)), "the parts' order")
	require.NotEqual(t, want, digest(body("x1", a, [2]string{"b", "3"})), "a value")
	require.NotEqual(t, want, digest(body("x1", a, [2]string{"c", "2"})), "a name")
	require.NotEqual(t, want, digest(body("x1", a)), "a part fewer")

	ct, raw := body("x1", a, b)
	require.Equal(t, want, digest(strings.ToUpper(ct[:9])+ct[9:], raw), "the media type's case")
	for _, odd := range []struct{ contentType, body string }{
		{"application/x-www-form-urlencoded", "a=1&b=2"},
		{"multipart/form-data", string(raw)},                 // no boundary
		{"multipart/form-data; boundary=other", string(raw)}, // not the body's boundary
		{ct, strings.TrimSuffix(string(raw), "--x1--\r\n")},  // cut short
	} {
		_, ok := multipartDigest(odd.contentType, []byte(odd.body))
		require.False(t, ok, odd.contentType)
	}
}

func FuzzCanonicalizers(f *testing.F) {
	f.Add(`{"b":1,"a":[1,2,{"d":null,"c":"\u00e9"}]}`)
	f.Add(`not json`)
	f.Add(`{"amount":1e400,"id":12345678901234567890}`)
	f.Add(`[0.1, -0, 5e2, "a<b"]`)
	f.Add(`{"amount":5,"Amount":500,"p":{"a":1},"P":{"b":2},"p":{"A":3}}`)
	f.Add(`{"payment":{"AMOUNT":1,"amount":2},"Payment":{"amount":3},"p":[{"\u212a":1}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		once, err := canonicalJSON([]byte(body))
		if err != nil {
			return
		}
		// The canonical form is JSON, and a fixed point.
		require.True(t, json.Valid(once), "%s", once)
		twice, err := canonicalJSON(once)
		require.NoError(t, err)
		require.Equal(t, string(once), string(twice))
		// It keeps the value: decoded again, it is equal (as far as
		// encoding/json's float64 numbers can tell).
		var a, b any
		if json.Unmarshal([]byte(body), &a) == nil { // not when a number overflows float64
			require.NoError(t, json.Unmarshal(once, &b))
			require.Equal(t, a, b)
		}
		// And a struct decodes it as it decodes the body, which matches
		// names whatever their case and merges repeated members.
		var pa, pb caseProbe
		errA, errB := json.Unmarshal([]byte(body), &pa), json.Unmarshal(once, &pb)
		require.Equal(t, errA == nil, errB == nil, "%v, %v", errA, errB)
		require.Equal(t, pa, pb, "%s", once)
	})
}

// Canonical JSON ignores member order, spacing and number spelling, and
// keeps every value apart that differs, however large.
func TestCanonicalJSON(t *testing.T) {
	same := [][2]string{
		{`{"b":1,"a":2}`, `{ "a" : 2 , "b" : 1 }`},
		{`{"n":500}`, `{"n":5e2}`},
		{`{"n":0.5}`, `{"n":5E-1}`},
		{`{"n":-0.0}`, `{"n":0}`},
		{`{"n":120.50}`, `{"n":1.205e+2}`},
		{`{"s":"\u00e9"}`, `{"s":"é"}`},
		{`{"a":{"y":[1,{"q":1,"p":2}],"x":null}}`, `{"a":{"x":null,"y":[1,{"p":2,"q":1}]}}`},
		{`{"b":1,"a":2,"B":3}`, `{"a":2,"b":1,"B":3}`},
	}
	for _, tc := range same {
		a, err := canonicalJSON([]byte(tc[0]))
		require.NoError(t, err)
		b, err := canonicalJSON([]byte(tc[1]))
		require.NoError(t, err)
		require.Equal(t, string(a), string(b), "%s vs %s", tc[0], tc[1])
	}
	differ := [][2]string{
		{`{"id":1234567890123456789}`, `{"id":1234567890123456788}`},
		{`{"n":1}`, `{"n":"1"}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":null}`, `{}`},
		{`{"n":0.1}`, `{"n":0.10000000000000001}`},
		{`{"a":1,"A":2}`, `{"A":2,"a":1}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"first_name":1,"firstName":2}`, `{"firstName":2,"first_name":1}`},
	}
	for _, tc := range differ {
		a, _ := canonicalJSON([]byte(tc[0]))
		b, _ := canonicalJSON([]byte(tc[1]))
		require.NotEqual(t, string(a), string(b), "%s vs %s", tc[0], tc[1])
	}
	_, err := canonicalJSON([]byte(`{"a":1} {"b":2}`))
	require.Error(t, err, "two values are not one JSON text")
}

// A quoted key decodes to what a client meant, and refuses what it cannot
// have meant.
func FuzzStructuredString(f *testing.F) {
	f.Add("abc")
	f.Add(`a"b\c`)
	f.Fuzz(func(t *testing.T, key string) {
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		got, err := structuredString(quoted)
		printable := validKey(key, len(key)+1) || key == ""
		if printable {
			require.NoError(t, err)
			require.Equal(t, key, got)
		} else {
			require.Error(t, err)
		}
	})
}

// caseProbe decodes a body as a Go handler would: encoding/json matches
// member names to fields whatever their case, the last match wins, and a
// repeated object member is decoded into the same struct again.
type caseProbe struct {
	Amount  float64 `json:"amount"`
	Payment struct {
		Amount float64 `json:"amount"`
	} `json:"payment"`
	P struct{ A, B any } `json:"p"`
}

// Bodies that a Go handler decodes differently are different requests,
// also when they differ only in the case or the repetition of names.
func TestMembersDifferingInCaseAreDifferentRequests(t *testing.T) {
	tests := []struct {
		name          string
		fp            Fingerprinter
		first, second string
	}{
		{"CanonicalJSON, the last of two wins", CanonicalJSON, `{"amount":5,"Amount":500}`, `{"Amount":500,"amount":5}`},
		{"CanonicalJSON, nested", CanonicalJSON, `{"payment":{"amount":5,"AMOUNT":500}}`, `{"payment":{"AMOUNT":500,"amount":5}}`},
		{"CanonicalJSON, a repeated object merges", CanonicalJSON, `{"p":{"a":1},"p":{"b":2}}`, `{"p":{"b":2}}`},
		{"JSONFields, another case after", JSONFields("amount"), `{"amount":5}`, `{"amount":5,"AMOUNT":500}`},
		{"JSONFields, only another case", JSONFields("amount"), `{}`, `{"Amount":500}`},
		{"JSONFields, nested", JSONFields("payment.amount"), `{"payment":{"amount":5}}`, `{"payment":{"amount":5},"Payment":{"amount":500}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a, b caseProbe
			require.NoError(t, json.Unmarshal([]byte(tc.first), &a))
			require.NoError(t, json.Unmarshal([]byte(tc.second), &b))
			require.NotEqual(t, a, b, "a Go handler tells the two apart")

			s := newShop(t, WithFingerprint(tc.fp))
			c := s.client()
			require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", tc.first).status)
			requireProblem(t, s.post(c, "/payments", "k", tc.second), 422, "key-reused")
			require.Equal(t, "true", s.post(c, "/payments", "k", tc.first).header.Get(ReplayedHeader))
		})
	}
}

// Two requests share a fingerprint only when they ask for the same thing:
// the same method, path, query and body. Separators cannot be forged, since
// a method has no NUL, an escaped path none either, and the body's hash has
// a fixed length.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "a=1", []byte(`{"qty":1}`), "POST", "/orders", "a=1", []byte(`{"qty":2}`))
	f.Add("POST", "/a", "b", []byte(""), "POST", "/a?b", "", []byte(""))
	f.Add("PUT", "/x", "", []byte("y"), "PUT", "/x", "y", []byte(""))
	f.Fuzz(func(t *testing.T, m1, p1, q1 string, b1 []byte, m2, p2, q2 string, b2 []byte) {
		if !validMethod(m1) || !validMethod(m2) {
			return
		}
		r1 := &http.Request{Method: m1, URL: &url.URL{Path: p1, RawQuery: q1}}
		r2 := &http.Request{Method: m2, URL: &url.URL{Path: p2, RawQuery: q2}}
		same := m1 == m2 && r1.URL.EscapedPath() == r2.URL.EscapedPath() && q1 == q2 && bytes.Equal(b1, b2)
		if ((&config{}).fingerprint(r1, b1, true) == (&config{}).fingerprint(r2, b2, true)) != same {
			t.Fatalf("fingerprints of %q %q %q and %q %q %q: same request %v", m1, p1, q1, m2, p2, q2, same)
		}
	})
}

// validMethod is what net/http accepts as a method: an RFC 9110 token.
func validMethod(m string) bool {
	isTchar := func(r rune) bool {
		return r < 0x80 && (r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' ||
			strings.ContainsRune("!#$%&'*+-.^_`|~", r))
	}
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return !isTchar(r) }) < 0
}
