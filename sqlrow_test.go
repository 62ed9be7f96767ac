package idempotency

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The SQL store's rows (keyRow) are the Go twins of the Redis scripts: the
// same transitions must leave the same records, byte for byte, so that the
// golden records of the scripts (recordgolden_test.go) are the rows' too.
// The operator's settles (resolved, forgotten) are Redis's alone.
func TestRowsWriteTheGoldenRecords(t *testing.T) {
	rows := map[string]*keyRow{}
	row := func(name string) *keyRow {
		r := rows[name]
		if r == nil {
			r = &keyRow{}
			rows[name] = r
		}
		r.now, r.changed = time.Now().UnixMicro(), false
		return r
	}
	life, lease, horizon := goldenLife.Microseconds(), time.Minute.Microseconds(), time.Hour.Microseconds()
	ask := func(owner, abandoned string) claimAsk {
		return claimAsk{lockValue: owner, fingerprint: goldenFP, abandoned: abandoned, life: life,
			horizon: horizon, lease: lease}
	}
	var fenceA, fenceB string
	claimA := func(name string) {
		found := row(name).claim(ask(goldenOwner, "0"))
		require.Equal(t, "claimed", found.word, name)
		fenceA = found.fence
	}
	takeOver := func(name string) {
		row(name).holder = "" // the owner crashed: its lease lapsed
		found := row(name).claim(ask(goldenTaker, "1"))
		require.Equal(t, "claimed", found.word, name)
		require.True(t, found.retaken, name)
		fenceB = found.fence
	}
	complete := func(name, owner, fence string, rec *record) {
		f, err := strconv.ParseUint(fence, 10, 64)
		require.NoError(t, err)
		texts := newCompletionTexts(goldenFP, owner, f, rec)
		row(name).complete(owner, string(texts.buf[texts.claimed:]), string(texts.buf[:texts.claimed]), life)
	}
	journal := func(name, owner string) {
		owned, _ := row(name).step(owner, string(appendEntry(nil, entryResult, "charge", []byte(`{"id":"ch_1"}`))), 0, 0)
		require.Equal(t, 1, owned, name)
	}
	answer := newRecord(http.StatusCreated, []string{"Content-Type", "application/json", "Location", "/orders/7"},
		[]byte(`{"order":7}`))
	expect := func(name string) {
		want, err := os.ReadFile(goldenPath(name))
		require.NoError(t, err)
		got := rows[name].record
		if fenceB != "" {
			got = strings.ReplaceAll(got, fenceB, goldenFenceB)
		}
		got = strings.ReplaceAll(got, fenceA, goldenFenceA)
		require.Equal(t, string(want), got, "the SQL store's row leaves a %s record other than the scripts'", name)
		fenceA, fenceB = "", ""
	}

	claimA("claimed")
	expect("claimed")

	claimA("journaled")
	journal("journaled", goldenOwner)
	expect("journaled")

	claimA("done")
	complete("done", goldenOwner, fenceA, answer)
	expect("done")

	claimA("big")
	complete("big", goldenOwner, fenceA, nil)
	expect("big")

	claimA("written-back")
	row("written-back").record = "" // evicted mid-run
	complete("written-back", goldenOwner, fenceA, answer)
	expect("written-back")

	claimA("kept")
	row("kept").keep(goldenOwner)
	expect("kept")

	claimA("taken-over")
	journal("taken-over", goldenOwner)
	takeOver("taken-over")
	expect("taken-over")

	claimA("handed-back")
	journal("handed-back", goldenOwner)
	takeOver("handed-back")
	row("handed-back").release(goldenTaker)
	expect("handed-back")

	claimA("released-after-hand-back")
	journal("released-after-hand-back", goldenOwner)
	takeOver("released-after-hand-back")
	row("released-after-hand-back").release(goldenTaker)
	row("released-after-hand-back").release(goldenOwner)
	expect("released-after-hand-back")

	claimA("done-after-takeover")
	takeOver("done-after-takeover")
	complete("done-after-takeover", goldenTaker, fenceB, answer)
	expect("done-after-takeover")
}

// A row's claim reads every golden record as claim.lua does
// (TestGoldenRecordsAreRead): a finished one is replayed or refused, a run
// whose lease lapsed is abandoned past the horizon, and a record it cannot
// read is never claimed over.
func TestRowsReadTheGoldenRecords(t *testing.T) {
	horizon := time.Minute.Microseconds()
	for name, want := range map[string]string{
		"claimed": "abandoned", "journaled": "abandoned", "done": "done", "big": "big",
		"written-back": "done", "kept": "abandoned", "taken-over": "abandoned", "handed-back": "abandoned",
		"released-after-hand-back": "abandoned", "done-after-takeover": "done", "resolved": "done",
		"forgotten": "claimed",
	} {
		r := &keyRow{now: time.Now().UnixMicro(), record: goldenRecord(t, name, time.Hour)}
		r.recordUntil = r.now + time.Hour.Microseconds()
		found := r.claim(claimAsk{lockValue: "reader-lock", fingerprint: goldenFP, abandoned: "0",
			life: time.Hour.Microseconds(), horizon: horizon, lease: time.Minute.Microseconds()})
		require.Equal(t, want, found.word, name)
	}
	r := &keyRow{now: time.Now().UnixMicro(), record: "a record of another layout\n"}
	require.Equal(t, "corrupt", r.claim(claimAsk{lockValue: "x", fingerprint: goldenFP}).word)
	require.False(t, r.changed)
	require.Zero(t, r.complete("x", "done "+goldenFP+" x 1 1    \n201 0\n", "run "+goldenFP+" x 1 1    \n", 1),
		"an unreadable record is not ours: nothing is written over it")
	require.Equal(t, "a record of another layout\n", r.record)
}

// An issued token's claim of a row with no record is judged on the
// database's clock (the row's now): claimed while the token lives,
// refused as expired from its expiry on, and the row left as it was.
func TestSQLClaimOfATokenPastItsExpiryOnTheDatabasesClock(t *testing.T) {
	now := time.Now().UnixMicro()
	ask := claimAsk{lockValue: "lock", fingerprint: goldenFP, token: "t", abandoned: "0",
		life: time.Hour.Microseconds(), horizon: time.Hour.Microseconds(), lease: time.Minute.Microseconds()}
	for _, tc := range []struct {
		expires int64
		want    string
	}{{now + 1, "claimed"}, {now, "expired"}, {now - time.Second.Microseconds(), "expired"}, {0, "claimed"}} {
		r := &keyRow{now: now}
		ask.expires = tc.expires
		require.Equal(t, tc.want, r.claim(ask).word, "token expires %d µs after the database's now", tc.expires-now)
		require.Equal(t, tc.want == "claimed", r.changed)
	}
}
