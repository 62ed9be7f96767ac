package keyspace

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The operator's settle on an SQL row is settle.lua's twin: settling the
// golden claimed record leaves the golden resolved and forgotten records
// byte for byte, as the scripts wrote them (testdata/records in the root).
func TestSQLSettleWritesTheGoldenRecords(t *testing.T) {
	golden := func(name string) string {
		text, err := os.ReadFile(filepath.Join("..", "..", "testdata", "records", name+".txt"))
		require.NoError(t, err)
		return string(text)
	}
	claimed := golden("claimed")
	now := time.Now().UnixMicro()
	row := func() *sqlRow {
		return &sqlRow{record: claimed, recordUntil: now + time.Hour.Microseconds(), now: now}
	}
	owner := "ownerA_lock-value"

	reply, text, _ := row().settle(settlement{forget: true, owner: owner, ttl: time.Hour})
	require.Equal(t, "settled", reply)
	require.Equal(t, golden("forgotten"), text)

	resolved, ok := ParseRecord(golden("resolved"))
	require.True(t, ok)
	reply, text, _ = row().settle(settlement{owner: owner, ttl: time.Hour, state: resolved.State,
		status: resolved.Status, header: resolved.Header, body: resolved.Body, fingerprint: resolved.Fingerprint})
	require.Equal(t, "settled", reply)
	require.Equal(t, golden("resolved"), text)
}
