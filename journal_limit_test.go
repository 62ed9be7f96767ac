package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// emptyCodec encodes every value as no bytes, as protobuf does a message
// whose fields are all unset (emptypb.Empty): zero values come back.
type emptyCodec struct{}

func (emptyCodec) Marshal(any) ([]byte, error) { return []byte{}, nil }
func (emptyCodec) Unmarshal([]byte, any) error { return nil }

// The journal of one run, step names and all, stays within
// WithMaxResponseBytes: a loop of steps with tiny results (JSON's 0) or
// none at all (an empty protobuf message) cannot grow the key's record,
// which every step and every takeover reads whole, past the limit.
func TestTheJournalStaysWithinTheResponseLimit(t *testing.T) {
	const limit = 256
	for _, tc := range []struct {
		name string
		opts []DoOption
	}{
		{"one-byte results", nil},
		{"empty results", []DoOption{UseCodec(emptyCodec{})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := twoInstances(t, WithMaxResponseBytes(limit))
			k := functionKeys(m, "k")
			_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
				for i := range 200 {
					_, err := Step(ctx, fmt.Sprintf("notify-%03d", i), func(context.Context) (int, error) { return 0, nil })
					if errors.Is(err, ErrStepTooLarge) {
						break
					}
					require.NoError(t, err)
				}
				rec, err := redistest.ReadRecord(ctx, m.redis.client, k.record)
				require.NoError(t, err)
				require.LessOrEqual(t, len(rec.Journal), limit, "the journal past WithMaxResponseBytes")
				return 0, nil
			}, append([]DoOption{Resumable()}, tc.opts...)...)
			require.NoError(t, err)
		})
	}
}

// countingCodec is JSON that counts its decodings.
type countingCodec struct{ decoded *atomic.Int32 }

func (c countingCodec) Marshal(v any) ([]byte, error) { return JSON.Marshal(v) }
func (c countingCodec) Unmarshal(data []byte, v any) error {
	c.decoded.Add(1)
	return JSON.Unmarshal(data, v)
}

// A result past WithMaxResponseBytes, a step's or a function's, is refused
// before the round-trip check, which would decode a copy as large as the
// result only to refuse it: one request's large result costs its
// encoding, not three times its size.
func TestAResultTooLargeIsRefusedBeforeItIsDecoded(t *testing.T) {
	const limit = 1024
	big := strings.Repeat("x", 4*limit)
	m, _ := twoInstances(t, WithMaxResponseBytes(limit))
	var decoded atomic.Int32
	codec := UseCodec(countingCodec{&decoded})
	_, err := Do(context.Background(), m, Key{ID: "step"}, func(ctx context.Context) (int, error) {
		v, err := Step(ctx, "fetch", func(context.Context) (string, error) { return big, nil })
		require.ErrorIs(t, err, ErrStepTooLarge)
		require.Equal(t, big, v, "the step's result, returned with the error")
		require.Zero(t, decoded.Load(), "the step's result was decoded")
		return 0, nil
	}, Resumable(), codec)
	require.NoError(t, err)
	decoded.Store(0) // the function's own result, 0, was checked

	v, err := Do(context.Background(), m, Key{ID: "function"}, func(context.Context) (string, error) { return big, nil }, codec)
	require.Equal(t, big, v)
	require.NoError(t, err, "an answer too large is not the first call's error")
	_, err = Do(context.Background(), m, Key{ID: "function"}, func(context.Context) (string, error) { return "", nil }, codec)
	require.ErrorIs(t, err, ErrNotReplayable)
	require.Zero(t, decoded.Load(), "the function's result was decoded")

	require.Equal(t, entrySize("fetch", 7), len(appendEntry(nil, entryResult, "fetch", []byte("1234567"))))
	require.Equal(t, entrySize("", 12345), len(appendEntry(nil, entryError, "", make([]byte, 12345))))
}
