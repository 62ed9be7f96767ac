package optimistic

import (
	"errors"
	"math"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestCompareAndSet(t *testing.T) {
	prefix := "test-optimistic-" + t.Name()
	rdb := redistest.Client(t, prefix)
	ctx := t.Context()
	for _, h := range []Hash{{}, {VersionField: "rev"}} {
		vf := h.versionField()
		key := prefix + ":acct:" + vf
		t.Run(vf, func(t *testing.T) {
			fields, v, err := h.Read(ctx, rdb, key)
			require.NoError(t, err)
			require.Empty(t, fields)
			require.Zero(t, v, "a missing hash reads at version 0")

			for _, tc := range []struct {
				name     string
				expected int64
				fields   map[string]any
				version  int64 // the new version, or the current one on a conflict
				conflict bool
				missing  bool
				stored   map[string]string
			}{
				{name: "create", expected: 0, fields: map[string]any{"owner": "ann", "balance": 10},
					version: 1, stored: map[string]string{"owner": "ann", "balance": "10"}},
				{name: "create again", expected: 0, fields: map[string]any{"owner": "bob"},
					version: 1, conflict: true, stored: map[string]string{"owner": "ann", "balance": "10"}},
				{name: "update", expected: 1, fields: map[string]any{"balance": 25, "note": []byte("raw")},
					version: 2, stored: map[string]string{"owner": "ann", "balance": "25", "note": "raw"}},
				{name: "stale", expected: 1, fields: map[string]any{"balance": 0},
					version: 2, conflict: true, stored: map[string]string{"owner": "ann", "balance": "25", "note": "raw"}},
				{name: "future", expected: 9, fields: map[string]any{"balance": 0},
					version: 2, conflict: true, stored: map[string]string{"owner": "ann", "balance": "25", "note": "raw"}},
				{name: "version only", expected: 2,
					version: 3, stored: map[string]string{"owner": "ann", "balance": "25", "note": "raw"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					v, err := h.CompareAndSet(ctx, rdb, key, tc.expected, tc.fields)
					if tc.conflict {
						require.ErrorIs(t, err, ErrConflict)
						require.NotErrorIs(t, err, ErrNotFound)
						var conflict *ConflictError
						require.ErrorAs(t, err, &conflict)
						require.Equal(t, ConflictError{Resource: "hash " + key, Expected: tc.expected, Current: tc.version}, *conflict)
					} else {
						require.NoError(t, err)
						require.Equal(t, tc.version, v)
					}
					fields, v, err := h.Read(ctx, rdb, key)
					require.NoError(t, err)
					require.Equal(t, tc.stored, fields)
					require.Equal(t, tc.version, v)
				})
			}
		})
	}

	missing := prefix + ":missing"
	_, err := Hash{}.CompareAndSet(ctx, rdb, missing, 3, map[string]any{"a": 1})
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorIs(t, err, ErrNotFound)
	var conflict *ConflictError
	require.ErrorAs(t, err, &conflict)
	require.True(t, conflict.Missing)
	require.Zero(t, rdb.Exists(ctx, missing).Val(), "a refused write creates nothing")

	big := prefix + ":big"
	require.NoError(t, rdb.HSet(ctx, big, "version", math.MaxInt64-1).Err())
	v, err := Hash{}.CompareAndSet(ctx, rdb, big, math.MaxInt64-1, nil)
	require.NoError(t, err)
	require.Equal(t, int64(math.MaxInt64), v, "versions stay exact past 2^53")

	for _, tc := range []struct {
		name    string
		setup   func(key string)
		call    func(key string) error
		wantErr string
	}{
		{"negative expected version", nil, func(key string) error {
			_, err := Hash{}.CompareAndSet(ctx, rdb, key, -1, nil)
			return err
		}, "negative expected version"},
		{"sets the version field", nil, func(key string) error {
			_, err := Hash{}.CompareAndSet(ctx, rdb, key, 0, map[string]any{"version": 7})
			return err
		}, "managed by the helper"},
		{"sets the fence field", nil, func(key string) error {
			_, err := Hash{FenceField: "epoch"}.CompareAndSet(ctx, rdb, key, 0, map[string]any{"epoch": 0})
			return err
		}, "managed by the helper"},
		{"unversioned hash", func(key string) { rdb.HSet(ctx, key, "a", 1) }, func(key string) error {
			_, err := Hash{}.CompareAndSet(ctx, rdb, key, 0, map[string]any{"a": 2})
			return err
		}, "no version field"},
		{"read of an unversioned hash", func(key string) { rdb.HSet(ctx, key, "a", 1) }, func(key string) error {
			_, _, err := Hash{}.Read(ctx, rdb, key)
			return err
		}, "no version field"},
		{"read of a corrupt version", func(key string) { rdb.HSet(ctx, key, "version", "x") }, func(key string) error {
			_, _, err := Hash{}.Read(ctx, rdb, key)
			return err
		}, `holds "x"`},
		{"wrong type", func(key string) { rdb.Set(ctx, key, "s", 0) }, func(key string) error {
			_, err := Hash{}.CompareAndSet(ctx, rdb, key, 0, nil)
			return err
		}, "WRONGTYPE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := prefix + ":edge:" + tc.name
			if tc.setup != nil {
				tc.setup(key)
			}
			err := tc.call(key)
			require.ErrorContains(t, err, tc.wantErr)
			require.False(t, errors.Is(err, ErrConflict), "not a conflict: Retry must stop")
		})
	}
}
