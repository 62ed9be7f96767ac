package keyspace

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// A claim whose lease lapsed is not interrupted, and not settled, until
// the claim horizon has passed since it, on the database's clock: its
// executor may be live (a stall, a pause) and still store its answer.
// A run that ended kept is interrupted at once.
func TestSQLSettleWaitsForTheClaimHorizon(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "..", "testdata", "records", "claimed.txt"))
	require.NoError(t, err)
	const horizon = 30 * time.Second
	now := time.Now().UnixMicro()
	row := func(age time.Duration, kept bool) *sqlRow {
		rec := strings.ReplaceAll(string(text), "{fence-a}", strconv.FormatInt(now-age.Microseconds(), 10))
		if kept {
			rec = strings.Replace(rec, "ownerA_lock-value", "!ownerA_lock-value", 1)
		}
		return &sqlRow{record: rec, recordUntil: now + time.Hour.Microseconds(), now: now}
	}
	for _, c := range []struct {
		name  string
		age   time.Duration
		kept  bool
		reply string
	}{
		{"young", time.Second, false, "young"},
		{"past the horizon", time.Minute, false, "settled"},
		{"kept", time.Second, true, "settled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := row(c.age, c.kept)
			st := r.state("k", horizon)
			require.Equal(t, c.reply == "settled", st.Interrupted)
			reply, _, _ := r.settle(settlement{forget: true, owner: st.Owner, ttl: time.Hour, horizon: horizon})
			require.Equal(t, c.reply, reply)
		})
	}
}
