package idempotency

import (
	"context"
	"errors"
	"fmt"
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
