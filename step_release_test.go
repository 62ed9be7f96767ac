package idempotency

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Release reports what it did: before a step it releases the key, and
// after a journaled step, whose key is kept for a retry to resume, it says
// false rather than a true that a client told "fix and retry with the same
// key" would find broken (422 key-reused until the record expires).
func TestReleaseReportsWhatItDidAroundSteps(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stepFirst bool
		released  bool
	}{
		{"before any step", false, true},
		{"after a journaled step", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := twoInstances(t)
			var said bool
			_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
				if tc.stepFirst {
					if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
						return 0, err
					}
				}
				said = Release(ctx)
				return 0, nil
			}, Resumable())
			require.NoError(t, err)
			require.Equal(t, tc.released, said)
			rec, err := m.store.client.Exists(context.Background(), functionKeys(m, "k").record).Result()
			require.NoError(t, err)
			require.Equal(t, tc.released, rec == 0, "Release said %v", said)
		})
	}
}
