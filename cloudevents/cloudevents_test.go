package cloudevents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

const structuredEvent = `{"specversion":"1.0","id":"evt-1","source":"https://shop.example/orders","type":"order.paid","data":{"id":"not-this-one","source":"nor-this"}}`

func TestKey(t *testing.T) {
	binary := func(pairs ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i < len(pairs); i += 2 {
			h.Add(pairs[i], pairs[i+1])
		}
		return h
	}
	structured := http.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}
	tests := []struct {
		name    string
		header  http.Header
		body    string
		want    string
		wantErr bool
	}{
		{"binary", binary("ce-id", "evt-1", "ce-source", "/orders"), `{"id":"data"}`, "evt-1", false},
		{"binary percent-encoded", binary("ce-id", "evt%201%25"), ``, "evt 1%", false},
		{"binary without id", binary("ce-source", "/orders"), `{"id":"data"}`, "", false},
		{"binary id repeated", binary("ce-id", "a", "ce-id", "b"), ``, "", true},
		{"binary bad escape", binary("ce-id", "evt%zz"), ``, "", true},
		{"binary without content type", http.Header{"Ce-Id": {"evt-1"}}, ``, "evt-1", false},
		{"structured", structured, structuredEvent, "evt-1", false},
		{"structured ignores ce-id", http.Header{"Content-Type": {"application/cloudevents+json"}, "Ce-Id": {"hdr"}}, structuredEvent, "evt-1", false},
		{"structured id last", structured, `{"data":{"id":"x"},"source":"/s","id":"evt-2"}`, "evt-2", false},
		{"structured without id", structured, `{"source":"/s"}`, "", false},
		{"structured null id", structured, `{"id":null}`, "", false},
		{"structured upper-case ID is not id", structured, `{"ID":"evt-1"}`, "", false},
		{"structured numeric id", structured, `{"id":17}`, "", true},
		{"structured id repeated", structured, `{"id":"a","id":"b"}`, "", true},
		{"structured not an object", structured, `["evt-1"]`, "", true},
		{"structured empty body", structured, ``, "", true},
		{"structured truncated", structured, `{"id":"evt-1",`, "", true},
		{"structured trailing data", structured, `{"id":"evt-1"}{"id":"evt-2"}`, "", true},
		{"batch", http.Header{"Content-Type": {"application/cloudevents-batch+json"}}, `[` + structuredEvent + `]`, "", true},
		{"other structured format", http.Header{"Content-Type": {"application/cloudevents+avro"}}, `x`, "", true},
		// The parameters are never read: a malformed one leaves the mode
		// as the media type says.
		{"structured, malformed parameter", http.Header{"Content-Type": {"application/cloudevents+json; charset"}, "Ce-Id": {"hdr"}}, structuredEvent, "evt-1", false},
		{"structured, repeated parameter", http.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8; charset=utf-8"}, "Ce-Id": {"hdr"}}, structuredEvent, "evt-1", false},
		{"structured, upper case and spaces", http.Header{"Content-Type": {" Application/CloudEvents+JSON ;charset=\"utf-8"}, "Ce-Id": {"hdr"}}, structuredEvent, "evt-1", false},
		{"batch, malformed parameter", http.Header{"Content-Type": {"application/cloudevents-batch+json; charset"}}, `[` + structuredEvent + `]`, "", true},
		{"malformed structured media type", http.Header{"Content-Type": {"application/cloudevents+json garbage"}, "Ce-Id": {"hdr"}}, structuredEvent, "", true},
		{"binary, malformed parameter", http.Header{"Content-Type": {"application/json; charset"}, "Ce-Id": {"evt-1"}}, `{"id":"data"}`, "evt-1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/callbacks", strings.NewReader(tc.body))
			r.Header = tc.header
			got, err := Key(r, []byte(tc.body))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestScope(t *testing.T) {
	tests := []struct {
		name    string
		path    string
		header  http.Header
		body    string
		want    string
		wantErr bool
	}{
		{"binary", "/cb", http.Header{"Ce-Source": {"https://shop.example/orders"}}, `{}`, "3:/cbhttps://shop.example/orders", false},
		{"binary percent-encoded", "/cb", http.Header{"Ce-Source": {"urn:shop%3Aeu"}}, ``, "3:/cburn:shop:eu", false},
		{"binary without source", "/cb", http.Header{"Ce-Id": {"evt-1"}}, ``, "", true},
		{"binary source repeated", "/cb", http.Header{"Ce-Source": {"a", "b"}}, ``, "", true},
		{"structured", "/cb", http.Header{"Content-Type": {"application/cloudevents+json"}}, structuredEvent, "3:/cbhttps://shop.example/orders", false},
		{"structured without source", "/cb", http.Header{"Content-Type": {"application/cloudevents+json"}}, `{"id":"evt-1"}`, "", true},
		{"structured broken", "/cb", http.Header{"Content-Type": {"application/cloudevents+json"}}, `{"source":`, "", true},
		{"another route", "/cb/audit", http.Header{"Ce-Source": {"https://shop.example/orders"}}, ``, "9:/cb/audithttps://shop.example/orders", false},
		// The length prefix keeps a path/source split from reading as another.
		{"ambiguous split", "/cbhttps:", http.Header{"Ce-Source": {"//shop.example/orders"}}, ``, "9:/cbhttps://shop.example/orders", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			r.Header = tc.header
			got, err := Scope(r)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			// Whatever the scope read, the handler still gets the whole body.
			rest, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			require.Equal(t, tc.body, string(rest))
		})
	}
}

// Two mounts of one receiver under http.StripPrefix are two routes: the
// scope has the path the client sent.
func TestScopeOfAStrippedPath(t *testing.T) {
	var scopes []string
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, err := Scope(r)
		require.NoError(t, err)
		scopes = append(scopes, scope)
	})
	for _, mount := range []string{"/eu", "/us"} {
		r := httptest.NewRequest(http.MethodPost, mount+"/cb", nil)
		r.Header.Set("Ce-Source", "urn:shop")
		http.StripPrefix(mount, receiver).ServeHTTP(httptest.NewRecorder(), r)
	}
	require.Equal(t, []string{"6:/eu/cburn:shop", "6:/us/cburn:shop"}, scopes)
}

// Under the middleware the body is a seekable copy: the scope reads it from
// the start and leaves it where it found it.
func TestScopeRestoresTheBodyPosition(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/cb", nil)
	r.Header.Set("Content-Type", "application/cloudevents+json")
	r.Body = struct {
		io.ReadSeeker
		io.Closer
	}{strings.NewReader(structuredEvent), io.NopCloser(nil)}
	head := make([]byte, 5)
	_, err := io.ReadFull(r.Body, head)
	require.NoError(t, err)

	scope, err := Scope(r)
	require.NoError(t, err)
	require.Equal(t, "3:/cbhttps://shop.example/orders", scope)
	rest, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, structuredEvent, string(head)+string(rest))
}

func TestScopeBodyLimitOutsideTheMiddleware(t *testing.T) {
	big := `{"source":"/s","data":"` + strings.Repeat("x", scopeBodyLimit) + `"}`
	r := httptest.NewRequest(http.MethodPost, "/cb", strings.NewReader(big))
	r.Header.Set("Content-Type", "application/cloudevents+json")
	_, err := Scope(r)
	require.ErrorIs(t, err, idempotency.ErrRequestTooLarge)
	rest, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, big, string(rest), "nothing of the body is lost")
}

// The extractors through the real middleware and Redis: structured and
// binary events, scoped by source, replayed, and refused as the contract says.
func TestThroughTheMiddleware(t *testing.T) {
	const prefix = "test-cloudevents"
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix),
		idempotency.WithKeyExtractor(Key), idempotency.WithScope(Scope), idempotency.WithMaxRequestBytes(4096))
	var execs atomic.Int64
	srv := httptest.NewServer(idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Request-Body", string(body))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, execs.Add(1))
	})))
	t.Cleanup(srv.Close)
	send := func(header http.Header, body string) *httptest.ResponseRecorder {
		return postEvent(t, srv, header, body)
	}
	refused := func(a *httptest.ResponseRecorder, status int, slug string) {
		t.Helper()
		require.Equal(t, status, a.Code, a.Body.String())
		require.Contains(t, a.Body.String(), `"type":"`+idempotency.ProblemTypeBase+slug+`"`)
	}
	structured := http.Header{"Content-Type": {"application/cloudevents+json"}}
	binary := func(id, source string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Ce-Id": {id}, "Ce-Source": {source}, "Ce-Specversion": {"1.0"}}
	}
	event := func(id, source, data string) string {
		b, err := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": source, "type": "t", "data": json.RawMessage(data)})
		require.NoError(t, err)
		return string(b)
	}

	first := send(structured, event("e1", "/a", `{"n":1}`))
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.Equal(t, `{"execution":1}`, first.Body.String())
	require.Equal(t, event("e1", "/a", `{"n":1}`), first.Header().Get("X-Request-Body"), "the handler reads the whole event")

	again := send(structured, event("e1", "/a", `{"n":1}`))
	require.Equal(t, "true", again.Header().Get(idempotency.ReplayedHeader))
	require.Equal(t, first.Body.String(), again.Body.String())

	// The same id from another source is another event.
	require.Equal(t, `{"execution":2}`, send(structured, event("e1", "/b", `{"n":1}`)).Body.String())
	// Binary mode: the data is the body, the attributes are headers.
	require.Equal(t, `{"execution":3}`, send(binary("e2", "/a"), `{"n":2}`).Body.String())
	require.Equal(t, `{"execution":3}`, send(binary("e2", "/a"), `{"n":2}`).Body.String())
	// Same source and id, different event: a sender bug, never a replay.
	refused(send(structured, event("e1", "/a", `{"n":9}`)), 422, "key-reused")
	refused(send(binary("e3", ""), `{}`), 401, "no-scope")
	refused(send(structured, `{"source":"/a"}`), 400, "missing-key")
	refused(send(http.Header{"Content-Type": {"application/cloudevents-batch+json"}}, "["+event("e4", "/a", "1")+"]"), 400, "invalid-key")
	refused(send(structured, event("e5", "/a", `"`+strings.Repeat("x", 4096)+`"`)), 413, "request-too-large")
	require.EqualValues(t, 3, execs.Load())
}

// One event is one key whatever its content type's parameters say, a
// malformed one included, and whatever ce-id header a relay stamps beside
// a structured event: its redelivery is replayed, and another event with
// the same stray ce-id runs.
func TestAStructuredEventIsOneKeyWhateverItsParameters(t *testing.T) {
	const prefix = "test-cloudevents-parameters"
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix),
		idempotency.WithKeyExtractor(Key), idempotency.WithScope(Scope),
		idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	var runs atomic.Int32
	h := idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "run %d", runs.Add(1))
	}))
	deliver := func(event, contentType, ceID string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(event))
		r.Header.Set("Content-Type", contentType)
		r.Header.Set("Ce-Id", ceID)
		r.Header.Set("Ce-Source", "/orders")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const (
		first  = `{"specversion":"1.0","id":"evt-1","source":"/orders","type":"order.paid"}`
		second = `{"specversion":"1.0","id":"evt-2","source":"/orders","type":"order.paid"}`
	)
	a := deliver(first, "application/cloudevents+json", "relay-1")
	require.Equal(t, "run 1", a.Body.String())
	b := deliver(first, "application/cloudevents+json; charset", "relay-2")
	require.Equal(t, "run 1", b.Body.String(), "the same event is replayed")
	require.Equal(t, "true", b.Header().Get(idempotency.ReplayedHeader))
	c := deliver(second, "application/cloudevents+json; charset", "relay-2")
	require.Equal(t, "run 2", c.Body.String(), "another event with the same stray ce-id runs")
	require.EqualValues(t, 2, runs.Load())
}

func TestMain(m *testing.M) { redistest.Main(m) }

// postEvent posts an event to srv's /events and records the answer.
func postEvent(t *testing.T, srv *httptest.Server, header http.Header, body string) *httptest.ResponseRecorder {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/events", strings.NewReader(body))
	require.NoError(t, err)
	req.Header = header
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got := httptest.NewRecorder()
	maps.Copy(got.Header(), resp.Header)
	got.WriteHeader(resp.StatusCode)
	_, err = io.Copy(got, resp.Body)
	require.NoError(t, err)
	return got
}

func FuzzKey(f *testing.F) {
	f.Add("application/cloudevents+json", "", "", []byte(structuredEvent))
	f.Add("application/json", "evt-1", "/orders", []byte(`{"id":1}`))
	f.Add("application/cloudevents+json; charset=utf-8", "", "", []byte(`{"id":"a","source":"s","ID":"b"}`))
	f.Add("application/cloudevents+json; charset", "evt-1", "/orders", []byte(structuredEvent))
	f.Add("application/cloudevents-batch+json", "", "", []byte(`[]`))
	f.Add("text/plain", "%41%", "%zz", []byte(``))
	f.Fuzz(func(t *testing.T, contentType, ceID, ceSource string, body []byte) {
		request := func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/cb", bytes.NewReader(body))
			r.Header.Set("Content-Type", contentType)
			if ceID != "" {
				r.Header.Set("Ce-Id", ceID)
			}
			if ceSource != "" {
				r.Header.Set("Ce-Source", ceSource)
			}
			return r
		}
		// Extraction never panics and always finds the same key: a
		// redelivery is recognised.
		key, err := Key(request(), body)
		key2, err2 := Key(request(), body)
		require.Equal(t, key, key2)
		require.Equal(t, err == nil, err2 == nil)

		structured, _ := cloudEventStructured(request().Header)
		if err == nil && key != "" && structured {
			// The key is the event's id as any JSON reader sees it.
			var event map[string]any
			require.NoError(t, json.Unmarshal(body, &event))
			require.Equal(t, key, event["id"])
		}

		// The scope leaves the body whole for the handler.
		r := request()
		Scope(r)
		rest, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		require.Equal(t, body, rest)
	})
}
