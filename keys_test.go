package idempotency

import (
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/stretchr/testify/require"
)

func TestKeyNamesShareOneHashTag(t *testing.T) {
	tk := tokenKeys("idem", "session-1", "3f1e2d4c-5b6a-4789-8abc-def012345678")
	ck := clientKeys("idem", paymentID("order-42"))
	for _, k := range []keys{tk, ck} {
		names := k.redisKeys()
		tag := names[0][strings.Index(names[0], "{"):strings.Index(names[0], "}")]
		for _, name := range names {
			require.Contains(t, name, tag+"}:", "every key of one request in one slot")
		}
		require.Equal(t, keyspace.Waiters(k.record), k.waiters(), "the flag the operator's view reads")
	}
	require.Equal(t, "idem:"+tk.record[5:strings.Index(tk.record, "}")+2]+"r:3f1e2d4c-5b6a-4789-8abc-def012345678", tk.record)
	require.True(t, strings.HasSuffix(tk.lock, "}:l:3f1e2d4c-5b6a-4789-8abc-def012345678"))
	require.True(t, strings.HasSuffix(ck.record, "}:r"))
	require.True(t, strings.HasSuffix(ck.lock, "}:l"))
	require.NotEqual(t, ck.record, clientKeys("idem", paymentID("order-43")).record)
	require.NotEqual(t, ck.record, clientKeys("idem", identityOf(false, "/refunds", "order-42")).record)
}

// A spent token's record outlives the token on a store's clock that is
// behind the instance's by up to clockAllowance: the store judges the
// expiry on its own clock, and a record gone before the token expired
// there would let the token be spent again.
func TestATokensRecordOutlivesItOnALaggingStoreClock(t *testing.T) {
	k := keys{token: "t", tokenExpires: time.Now().Add(48 * time.Hour)}
	life := k.lifetime(24 * time.Hour)
	require.GreaterOrEqual(t, life, 48*time.Hour+clockAllowance-time.Second)
	require.GreaterOrEqual(t, clockAllowance, time.Minute)
	require.Equal(t, 24*time.Hour, keys{}.lifetime(24*time.Hour), "a client key's record lives as long as asked")
	require.Equal(t, 72*time.Hour, k.lifetime(72*time.Hour), "a record asked to live longer than the token does")
}
