package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := retryPolicy{base: time.Second, max: 30 * time.Second, maxServerErrors: 5}
	tests := []struct {
		name      string
		answer    answer
		delivered uint64
		want      verdict
	}{
		{"first run", answer{status: 200}, 1, verdict{action: ack}},
		{"created", answer{status: 201}, 1, verdict{action: ack}},
		{"replay", answer{status: 200, replayed: true}, 3, verdict{action: ack}},
		{"in progress", answer{status: 409, problem: "in-progress", retryAfter: "1"}, 1, verdict{action: retry, delay: time.Second, reason: "in progress"}},
		{"not replayable ran", answer{status: 409, problem: "not-replayable"}, 2, verdict{action: ack}},
		{"interrupted", answer{status: 409, problem: "interrupted"}, 2, verdict{action: deadLetter, reason: "interrupted: the execution that claimed it vanished"}},
		{"app conflict", answer{status: 409, problem: "superseded"}, 1, verdict{action: deadLetter, reason: "conflict superseded"}},
		{"store down", answer{status: 503, problem: "store-unavailable", retryAfter: "2"}, 1, verdict{action: retry, delay: 2 * time.Second, reason: "Service Unavailable"}},
		{"store down long", answer{status: 503, retryAfter: "3600"}, 1, verdict{action: retry, delay: 30 * time.Second, reason: "Service Unavailable"}},
		{"retry-after date", answer{status: 503, retryAfter: now.Add(4 * time.Second).Format(http.TimeFormat)}, 1, verdict{action: retry, delay: 4 * time.Second, reason: "Service Unavailable"}},
		{"retry-after past", answer{status: 429, retryAfter: now.Add(-time.Hour).Format(http.TimeFormat)}, 1, verdict{action: retry, delay: 0, reason: "Too Many Requests"}},
		{"no retry-after backs off", answer{status: 502}, 3, verdict{action: retry, delay: 4 * time.Second, reason: "Bad Gateway"}},
		{"server error retried", answer{status: 500}, 4, verdict{action: retry, delay: 8 * time.Second, reason: "Internal Server Error"}},
		{"server error given up", answer{status: 500}, 5, verdict{action: deadLetter, reason: "500 Internal Server Error"}},
		{"key reused", answer{status: 422, problem: "key-reused"}, 1, verdict{action: deadLetter, reason: "422 Unprocessable Entity: key-reused"}},
		{"bad event", answer{status: 400, problem: "/problems/invalid-event"}, 1, verdict{action: deadLetter, reason: "400 Bad Request: /problems/invalid-event"}},
		{"too large", answer{status: 413, problem: "request-too-large"}, 1, verdict{action: deadLetter, reason: "413 Request Entity Too Large: request-too-large"}},
		{"redirect", answer{status: 308}, 1, verdict{action: deadLetter, reason: "308 Permanent Redirect"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, p.judge(tc.answer, tc.delivered, now))
		})
	}
}

func TestBackOffIsCapped(t *testing.T) {
	p := retryPolicy{base: time.Second, max: 30 * time.Second}
	require.Equal(t, time.Second, p.delay("", 0, time.Now()))
	require.Equal(t, 16*time.Second, p.delay("", 5, time.Now()))
	require.Equal(t, 30*time.Second, p.delay("", 1<<40, time.Now()))
	require.Equal(t, 30*time.Second, p.delay("99999999999999", 1, time.Now()))
	require.Equal(t, time.Second, p.delay("soon", 1, time.Now()), "an unreadable Retry-After backs off")
}

func TestMessageKey(t *testing.T) {
	meta := func(stream string, seq uint64) *jetstream.MsgMetadata {
		m := &jetstream.MsgMetadata{Stream: stream, NumDelivered: 3}
		m.Sequence.Stream, m.Sequence.Consumer = seq, 99
		return m
	}
	withID := func(id string) nats.Header { return nats.Header{jetstream.MsgIDHeader: {id}} }
	long := strings.Repeat("x", 300)
	tests := []struct {
		name   string
		header nats.Header
		meta   *jetstream.MsgMetadata
		want   string
	}{
		{"stream sequence", nil, meta("ORDERS", 42), "ORDERS:seq:42"},
		{"publisher's id", withID("order-7-paid"), meta("ORDERS", 42), "ORDERS:id:order-7-paid"},
		{"same id, other stream", withID("order-7-paid"), meta("REFUNDS", 42), "REFUNDS:id:order-7-paid"},
		{"non-ASCII id digested", withID("commande-é"), meta("ORDERS", 1), "sha256:"},
		{"long id digested", withID(long), meta("ORDERS", 1), printableKey("ORDERS:id:" + long)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := messageKey(tc.header, tc.meta)
			if strings.HasPrefix(tc.want, "sha256:") {
				require.Regexp(t, `^sha256:[0-9a-f]{64}$`, got)
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}
