package idempotency

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExecutionOf(t *testing.T) {
	s := newShop(t)
	var got Execution
	var ok bool
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		got, ok = ExecutionOf(r.Context())
		w.WriteHeader(201)
	}
	s.post(s.client(), "/payments", "k", `{}`)
	require.True(t, ok)
	record := clientKeys(s.idem.cfg.prefix, paymentID("k")).record
	require.Equal(t, record, got.Key, "the record's name, prefix and all")
	require.Nil(t, got.Codec, "a handler has no codec")
	require.Len(t, got.Fingerprint, 64)
	require.NotZero(t, got.Fence)
	require.Equal(t, 1<<20, got.MaxResponseBytes, "the middleware's WithMaxResponseBytes")
	_, ok = ExecutionOf(context.Background())
	require.False(t, ok)
}
