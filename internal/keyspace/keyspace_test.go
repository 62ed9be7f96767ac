package keyspace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	const tok = "0d3c1a55-8c1e-4f7e-9d59-3c3f8a1b2c4d"
	key := Names{Record: "p:{kAbC}:r", Lock: "p:{kAbC}:l"}
	token := Names{Record: "p:{tXyZ}:r:" + tok, Lock: "p:{tXyZ}:l:" + tok, Token: tok}
	for _, tc := range []struct {
		name string
		want Names
	}{
		{"p:{kAbC}:r", key},
		{"p:{kAbC}:l", key},
		{"p:{kAbC}:r:w", key},
		{"p:{tXyZ}:r:" + tok, token},
		{"p:{tXyZ}:l:" + tok, token},
		{"p:{tXyZ}:r:" + tok + ":w", token},
		{"p:{kAbC}:l:w", Names{}},
		{"p:{tXyZ}:tokens", Names{}},
		{"p:{tXyZ}:r:", Names{}},
		{"p:{tXyZ}:r:a:b", Names{}},
		{"p:{k}:r", Names{}},
		{"p:{kAbC}:x", Names{}},
		{"p:kAbC:r", Names{}},
		{"q:{kAbC}:r", Names{}},
		{"pp:{kAbC}:r", Names{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("p", tc.name)
			if tc.want == (Names{}) {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// FuzzParse: an operator's name for a key (a record, a lock or a
// waiters flag) is read without panicking, and what it
// accepts names the same keys again from the record's own name.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"idem:{kAbC}:r", "idem:{kAbC}:l", Waiters("idem:{kAbC}:r"),
		"idem:{tXyZ}:r:tok", "idem:{tXyZ}:l:tok", Waiters("idem:{tXyZ}:r:tok"),
		"idem:{", "idem:{}:r", "{x}:r:a:b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := Parse("idem", name)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got.Record, "idem:{") || got.Lock == "" {
			t.Fatalf("%q read as %+v", name, got)
		}
		again, err := Parse("idem", got.Record)
		if err != nil || again != got {
			t.Fatalf("%q read as %+v, but its record %q as %+v (%v)", name, got, got.Record, again, err)
		}
	})
}
