package optimistic

import (
	"math"
	"strconv"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// fenceSteps is one history of fenced writes, shared by the SQL and Redis
// tests: each step writes owner with a token and either lands or is refused
// because the storage holds current.
var fenceSteps = []struct {
	name    string
	token   uint64
	owner   string
	stale   bool
	current uint64
}{
	{"first writer", 5, "a", false, 0},
	{"same execution writes again", 5, "a2", false, 0},
	{"lower token", 4, "old", true, 5},
	{"higher token", 1_700_000_000_000_001, "b", false, 0},
	// A retry after a lost commit acknowledgement writes the same values
	// with the same token: MySQL reports 0 changed rows, and it is no stale
	// write.
	{"same values, same token", 1_700_000_000_000_001, "b", false, 0},
	{"token a microsecond below", 1_700_000_000_000_000, "old", true, 1_700_000_000_000_001},
}

func TestFencedUpdate(t *testing.T) {
	eachDB(t, func(t *testing.T, d *testDB) {
		tbl := d.accounts(t, map[int64]int64{1: 10})
		ctx := t.Context()
		want := row{balance: 10}
		for _, step := range fenceSteps {
			t.Run(step.name, func(t *testing.T) {
				err := tbl.FencedUpdate(ctx, d.db, 1, step.token, Set("owner", step.owner), Set("order", 1))
				if step.stale {
					require.ErrorIs(t, err, ErrStaleFence)
					require.NotErrorIs(t, err, ErrConflict, "a stale writer must not retry")
					var stale *StaleFenceError
					require.ErrorAs(t, err, &stale)
					require.Equal(t, StaleFenceError{Resource: stale.Resource, Token: step.token, Current: step.current}, *stale)
					require.Contains(t, stale.Error(), tbl.Name)
				} else {
					require.NoError(t, err)
					want.owner.String, want.owner.Valid, want.fence = step.owner, true, int64(step.token)
				}
				require.Equal(t, want, d.row(t, tbl, 1))
			})
		}

		t.Run("missing row", func(t *testing.T) {
			err := tbl.FencedUpdate(ctx, d.db, 2, 7, Set("owner", "x"))
			require.ErrorIs(t, err, ErrNotFound)
			require.NotErrorIs(t, err, ErrStaleFence)
		})
		t.Run("no token", func(t *testing.T) {
			require.ErrorIs(t, tbl.FencedUpdate(ctx, d.db, 1, 0, Set("owner", "x")), ErrNoFencingToken)
		})
		t.Run("token beyond BIGINT", func(t *testing.T) {
			err := tbl.FencedUpdate(ctx, d.db, 1, math.MaxInt64+1, Set("owner", "x"))
			require.ErrorContains(t, err, "does not fit a BIGINT")
		})
		t.Run("fence only", func(t *testing.T) {
			require.NoError(t, tbl.FencedUpdate(ctx, d.db, 1, math.MaxInt64))
			require.Equal(t, int64(math.MaxInt64), d.row(t, tbl, 1).fence)
		})
		t.Run("null fence counts as zero", func(t *testing.T) {
			name := d.createTable(t, "id BIGINT PRIMARY KEY", "fence BIGINT", "note VARCHAR(10)")
			d.exec(t, "INSERT INTO "+name+" (id) VALUES (?)", 1)
			require.NoError(t, Table{Dialect: d.dialect, Name: name}.FencedUpdate(ctx, d.db, 1, 1, Set("note", "x")))
		})
	})
}

func TestFencedSet(t *testing.T) {
	prefix := "test-optimistic-" + t.Name()
	rdb := redistest.Client(t, prefix)
	ctx := t.Context()
	for _, h := range []Hash{{}, {FenceField: "tok"}} {
		key := prefix + ":order:" + orDefault(h.FenceField, "default")
		ff := orDefault(h.FenceField, "fence")
		t.Run(ff, func(t *testing.T) {
			want := map[string]string{}
			for _, step := range fenceSteps {
				t.Run(step.name, func(t *testing.T) {
					err := h.FencedSet(ctx, rdb, key, step.token, map[string]any{"owner": step.owner, "n": 1})
					if step.stale {
						require.ErrorIs(t, err, ErrStaleFence)
						require.NotErrorIs(t, err, ErrConflict)
						var stale *StaleFenceError
						require.ErrorAs(t, err, &stale)
						require.Equal(t, StaleFenceError{Resource: "hash " + key, Token: step.token, Current: step.current}, *stale)
					} else {
						require.NoError(t, err, "a missing hash is created")
						want = map[string]string{"owner": step.owner, "n": "1", ff: itoa(step.token)}
					}
					require.Equal(t, want, rdb.HGetAll(ctx, key).Val())
				})
			}
		})
	}

	key := prefix + ":edge"
	for _, tc := range []struct {
		name    string
		stored  string // the fence field before the write; "" for none
		token   uint64
		fields  map[string]any
		want    error
		wantErr string
	}{
		{name: "fence only", token: 3},
		{name: "no token", token: 0, want: ErrNoFencingToken},
		{name: "sets the fence field", token: 3, fields: map[string]any{"fence": 9}, wantErr: "managed by the helper"},
		{name: "sets the version field", token: 3, fields: map[string]any{"version": 0}, wantErr: "managed by the helper"},
		{name: "largest token", stored: "18446744073709551614", token: math.MaxUint64},
		{name: "largest token again", stored: "18446744073709551615", token: math.MaxUint64},
		{name: "below the largest token", stored: "18446744073709551615", token: math.MaxUint64 - 1, want: ErrStaleFence},
		{name: "leading zeros stored", stored: "0009", token: 10},
		{name: "leading zeros stored, equal", stored: "0010", token: 10},
		{name: "leading zeros stored, stale", stored: "0011", token: 10, want: ErrStaleFence},
		{name: "corrupt fence", stored: "12abc", token: 10, wantErr: "not a decimal token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb.Del(ctx, key)
			if tc.stored != "" {
				require.NoError(t, rdb.HSet(ctx, key, "fence", tc.stored).Err())
			}
			err := Hash{}.FencedSet(ctx, rdb, key, tc.token, tc.fields)
			switch {
			case tc.want != nil:
				require.ErrorIs(t, err, tc.want)
			case tc.wantErr != "":
				require.ErrorContains(t, err, tc.wantErr)
			default:
				require.NoError(t, err)
				require.Equal(t, itoa(tc.token), rdb.HGet(ctx, key, "fence").Val())
			}
		})
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
