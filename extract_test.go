package idempotency

import (
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExtractors(t *testing.T) {
	var multi bytes.Buffer
	mw := multipart.NewWriter(&multi)
	mw.WriteField("item", "tea")
	mw.WriteField("idempotency_token", "tok-from-multipart")
	mw.Close()

	tests := []struct {
		name        string
		extractor   KeyExtractor
		contentType string
		header      http.Header
		body        string
		want        string
		wantErr     bool
	}{
		{"header", HeaderKey("idempotency-key"), "", http.Header{"Idempotency-Key": {"abc"}}, "", "abc", false},
		{"header absent", HeaderKey(KeyHeader), "", nil, "", "", false},
		{"header repeated", HeaderKey(KeyHeader), "", http.Header{"Idempotency-Key": {"a", "b"}}, "", "", true},
		{"url-encoded form", FormKey("idempotency_token"), "application/x-www-form-urlencoded", nil, "item=tea&idempotency_token=t1", "t1", false},
		{"form without field", FormKey("idempotency_token"), "application/x-www-form-urlencoded", nil, "item=tea", "", false},
		{"broken form", FormKey("idempotency_token"), "application/x-www-form-urlencoded", nil, "a=%zz", "", true},
		{"multipart form", FormKey("idempotency_token"), mw.FormDataContentType(), nil, multi.String(), "tok-from-multipart", false},
		{"form field on JSON body", FormKey("idempotency_token"), "application/json", nil, `{"idempotency_token":"x"}`, "", false},
		{"JSON nested", JSONKey("event.id"), "application/json", nil, `{"event":{"id":"evt_1"}}`, "evt_1", false},
		{"JSON number", JSONKey("id"), "application/json", nil, `{"id":12345678901234567890}`, "12345678901234567890", false},
		{"JSON missing", JSONKey("event.id"), "application/json", nil, `{"event":{}}`, "", false},
		{"JSON object value", JSONKey("event"), "application/json", nil, `{"event":{}}`, "", true},
		{"not JSON", JSONKey("id"), "text/plain", nil, `id=1`, "", false},
		{"first of", FirstKey(HeaderKey(KeyHeader), JSONKey("id")), "application/json", nil, `{"id":"j"}`, "j", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			for k, v := range tc.header {
				r.Header[k] = v
			}
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			got, err := tc.extractor(r, []byte(tc.body))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestValidKey(t *testing.T) {
	require.True(t, validKey("order-42 retry_1", 255))
	require.False(t, validKey("", 255))
	require.False(t, validKey("a\r\nSet-Cookie: x", 255))
	require.False(t, validKey("naïve", 255))
	require.False(t, validKey(strings.Repeat("k", 256), 255))
}

// The form token reaches the handler inside an intact body, and a form post
// is protected like a JSON one.
func TestFormPostKeepsBodyForHandler(t *testing.T) {
	s := newShop(t)
	c := s.client()
	tok := s.token(c)
	form := "item=tea&idempotency_token=" + tok
	first := s.postForm(c, "/orders", form)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, form, first.header.Get("X-Request-Body"))
	again := s.postForm(c, "/orders", form)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
}

func TestRequestBodyLimit(t *testing.T) {
	s := newShop(t, WithMaxRequestBytes(16))
	c := s.client()
	requireProblem(t, s.post(c, "/payments", "k", strings.Repeat("x", 17)), 413, "request-too-large")
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", strings.Repeat("x", 16)).status)
}

// A limit set outside the middleware (http.MaxBytesHandler) refuses a
// body over it as the middleware's own limit does: 413, and nothing runs.
func TestOuterRequestBodyLimit(t *testing.T) {
	s := newShop(t)
	h := http.MaxBytesHandler(s.idem.ProtectKey(http.HandlerFunc(s.count)), 16)
	for body, want := range map[string]int{strings.Repeat("x", 17): 413, strings.Repeat("x", 16): 201} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set(KeyHeader, fmt.Sprint("k", len(body)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, w.Body.String())
		if want == 413 {
			require.Contains(t, w.Body.String(), "request-too-large")
		}
	}
	require.EqualValues(t, 1, s.execs.Load())
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add("Content-Type: application/json\nLocation: /orders/1\n")
	f.Add("")
	f.Add("X: \n")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := decodeHeader(s)
		if err != nil {
			return
		}
		// What decodes must survive a round trip, and replay without panic.
		again, err := decodeHeader(encodeHeader(h))
		require.NoError(t, err)
		require.Equal(t, h, again)
		newRecord(200, h, nil).write(httptest.NewRecorder(), nil, &config{}, false)
	})
}

func FuzzExtractors(f *testing.F) {
	f.Add("application/x-www-form-urlencoded", "idempotency_token=abc&x=1")
	f.Add("multipart/form-data; boundary=xx", "--xx\r\nContent-Disposition: form-data; name=\"idempotency_token\"\r\n\r\nabc\r\n--xx--\r\n")
	f.Add("application/json", `{"event":{"id":"e1"}}`)
	f.Fuzz(func(t *testing.T, contentType, body string) {
		extract := FirstKey(FormKey("idempotency_token"), JSONKey("event.id"))
		run := func() (string, error) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
			r.Header.Set("Content-Type", contentType)
			return extract(r, []byte(body))
		}
		// Whatever the input, extraction returns (never panics), and the
		// same request always yields the same key: a retry is recognised.
		key1, err1 := run()
		key2, err2 := run()
		require.Equal(t, key1, key2)
		require.Equal(t, err1 == nil, err2 == nil)
	})
}

// A scope function may read the body too; the handler still gets all of it.
func TestScopeFunctionReadingBodyLeavesItIntact(t *testing.T) {
	s := newShop(t, WithScope(func(r *http.Request) (string, error) {
		b, err := io.ReadAll(r.Body)
		return "tenant-" + strconv.Itoa(len(b)), err
	}))
	c := s.client()
	a := s.post(c, "/payments", "k", `{"amount":5}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, `{"amount":5}`, a.header.Get("X-Request-Body"))
}

// formReader parses the form before the protection, as CSRF and method
// override middleware do.
func formReader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseMultipartForm(1 << 20)
		r.PostFormValue("csrf")
		next.ServeHTTP(w, r)
	})
}

// Behind middleware that parsed the form, token mode finds the token in
// the parsed form, fingerprints the form, and serves the request.
func TestTokenInAFormParsedByOuterMiddleware(t *testing.T) {
	s := newShop(t)
	var execs atomic.Int64
	h := formReader(s.idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "item="+r.PostFormValue("item")+" n="+strconv.FormatInt(execs.Load(), 10))
	})))
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := s.client()
	tok := s.token(c)
	session := sessionOf(t, s, c)
	send := func(contentType string, body io.Reader) answer {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		req.Header.Set("Content-Type", contentType)
		req.AddCookie(&http.Cookie{Name: "idempotency_session", Value: session})
		return do(t, srv.Client(), req)
	}
	form := func(item string) answer {
		return send("application/x-www-form-urlencoded",
			strings.NewReader(url.Values{"idempotency_token": {tok}, "item": {item}, "csrf": {"x"}}.Encode()))
	}
	first := form("tea")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, "item=tea n=1", first.body)
	require.Equal(t, first.body, form("tea").body)
	requireProblem(t, form("coffee"), 422, "key-reused")

	tok = s.token(c)
	multi := func(item string) answer {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		mw.WriteField("idempotency_token", tok)
		mw.WriteField("item", item)
		fw, _ := mw.CreateFormFile("receipt", "r.txt")
		fw.Write([]byte("paper"))
		mw.Close()
		return send(mw.FormDataContentType(), &buf)
	}
	first = multi("milk")
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, "item=milk n=2", first.body)
	require.Equal(t, "true", multi("milk").header.Get(ReplayedHeader))
	requireProblem(t, multi("sugar"), 422, "key-reused")
	require.EqualValues(t, 2, execs.Load())
}
