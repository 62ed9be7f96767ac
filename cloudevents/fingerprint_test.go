package cloudevents

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// An event that reuses another's id (same source, same data) but differs
// in an identity attribute is refused in both modes alike, never answered
// with the other event's answer; a redelivery that differs only in its
// trace is the same event.
func TestFingerprintTellsEventsApart(t *testing.T) {
	const prefix = "test-cloudevents-fp"
	idem := idempotency.New(redistest.Client(t, prefix), idempotency.WithKeyPrefix(prefix),
		idempotency.WithKeyExtractor(Key), idempotency.WithScope(Scope), idempotency.WithFingerprint(Fingerprint))
	var execs atomic.Int64
	srv := httptest.NewServer(idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		w.WriteHeader(http.StatusAccepted)
	})))
	t.Cleanup(srv.Close)
	send := func(header http.Header, body string) (int, string, string) {
		got := postEvent(t, srv, header, body)
		return got.Code, got.Header().Get(idempotency.ReplayedHeader), got.Body.String()
	}
	binary := func(id string, attrs ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}, "Ce-Id": {id}, "Ce-Source": {"/orders"},
			"Ce-Specversion": {"1.0"}, "Ce-Type": {"order.paid"}}
		for i := 0; i < len(attrs); i += 2 {
			h.Set(attrs[i], attrs[i+1])
		}
		return h
	}
	structured := http.Header{"Content-Type": {"application/cloudevents+json"}}

	status, replayed, _ := send(binary("b1"), `{"n":1}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Empty(t, replayed)
	status, replayed, _ = send(binary("b1", "Ce-Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), `{"n":1}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "true", replayed, "another trace, the same event")
	for _, other := range [][]string{
		{"Ce-Type", "order.refunded"},
		{"Ce-Subject", "order-7"},
		{"Ce-Dataschema", "https://shop.example/v2"},
		{"Ce-Partitionkey", "p2"}, // an extension
		{"Content-Type", "text/plain"},
	} {
		status, replayed, body := send(binary("b1", other...), `{"n":1}`)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%v: %s", other, body)
		require.Empty(t, replayed)
		require.Contains(t, body, "key-reused")
	}

	const event = `{"specversion":"1.0","id":"s1","source":"/orders","type":"order.paid","data":{"n":1}}`
	status, _, _ = send(structured, event)
	require.Equal(t, http.StatusAccepted, status)
	status, replayed, _ = send(structured, `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",`+
		`"data":{"n":1},"type":"order.paid","source":"/orders","id":"s1","specversion":"1.0"}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "true", replayed, "another trace and member order, the same event")
	status, _, body := send(structured, strings.Replace(event, "order.paid", "order.refunded", 1))
	require.Equal(t, http.StatusUnprocessableEntity, status, body)
	require.EqualValues(t, 2, execs.Load())
}
