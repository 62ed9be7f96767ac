package idempotency

import (
	"context"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
)

// A record lives a day, across deploys: the scripts of one version read
// what the version before wrote. testdata/records holds a record of every
// state a key's life can leave, as the scripts wrote it when the layout
// was last changed on purpose. The scripts must write exactly these
// records today, and read them (TestGoldenRecordsAreRead); Go's codec
// must read each and write it back unchanged. A deliberate change of the
// layout regenerates them with -update-records, and its commit says how
// records of the version before are read.

var updateRecords = flag.Bool("update-records", false, "rewrite testdata/records from what the scripts write now")

const (
	goldenFP     = "6f1ed002ab5595859014ebf0951522d9d87a4c3a2b8b7e19b3b6c9a1b3e6b4aa"
	goldenOwner  = "ownerA_lock-value"
	goldenTaker  = "ownerB_lock-value"
	goldenFenceA = "{fence-a}" // in the files: the fences are Redis's clock
	goldenFenceB = "{fence-b}"
)

// goldenLife is a record's life in the middleware goldenRecords uses.
var goldenLife = time.Hour

// goldenRecords drives the scripts into every state a key's record can
// take, and returns each record's text with its fences named.
func goldenRecords(t *testing.T) map[string]string {
	ctx := t.Context()
	rdb := redistest.Client(t, "golden-records")
	m := New(rdb, WithKeyPrefix("golden-records"), WithRecordTTL(goldenLife), WithLockLease(time.Minute),
		WithExecutionTimeout(time.Second))
	taker := New(rdb, WithKeyPrefix("golden-records"), WithRecordTTL(goldenLife), WithLockLease(time.Minute),
		WithExecutionTimeout(time.Second), WithRetryAbandoned())
	got := map[string]string{}
	header := []string{"Content-Type", "application/json", "Location", "/orders/7"}
	answer := newRecord(http.StatusCreated, header, []byte(`{"order":7}`))

	var fenceA, fenceB string
	claimA := func(name string) keys {
		k := functionKeys(m, name)
		cl, err := m.redis.claim(ctx, k, goldenOwner, goldenFP)
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, cl.outcome, name)
		fenceA = strconv.FormatUint(cl.fence, 10)
		return k
	}
	crash := func(k keys) { require.NoError(t, rdb.Del(ctx, k.lock).Err()) }
	takeOver := func(k keys) {
		crash(k)
		cl, err := taker.redis.claim(ctx, k, goldenTaker, goldenFP)
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, cl.outcome)
		fenceB = strconv.FormatUint(cl.fence, 10)
	}
	complete := func(mw *Middleware, k keys, owner, fence string, rec *record) {
		f, err := strconv.ParseUint(fence, 10, 64)
		require.NoError(t, err)
		_, err = mw.redis.complete(ctx, k, &owner, goldenFP, f, rec, goldenLife)
		require.NoError(t, err)
	}
	journal := func(mw *Middleware, k keys, owner string, before int) {
		proof, err := mw.redis.journal(ctx, k, owner, appendEntry(nil, entryResult, "charge", []byte(`{"id":"ch_1"}`)), before)
		require.NoError(t, err)
		require.Equal(t, 1, proof.owned)
	}
	read := func(name string, k keys) {
		text, err := rdb.Get(ctx, k.record).Result()
		require.NoError(t, err, name)
		if fenceB != "" {
			text = strings.ReplaceAll(text, fenceB, goldenFenceB)
		}
		got[name] = strings.ReplaceAll(text, fenceA, goldenFenceA)
		fenceA, fenceB = "", ""
	}
	settled := func(k keys) keyspace.State {
		crash(k)
		// and the claim horizon with it: the executor can no longer store.
		require.NoError(t, redistest.Age(ctx, rdb, k.record, time.Hour))
		f, err := strconv.ParseUint(fenceA, 10, 64)
		require.NoError(t, err)
		fenceA = strconv.FormatUint(f-uint64(time.Hour.Microseconds()), 10)
		st, err := m.operated().Inspect(ctx, k.record)
		require.NoError(t, err)
		require.True(t, st.Interrupted)
		return st
	}

	k := claimA("claimed")
	read("claimed", k)

	k = claimA("journaled")
	journal(m, k, goldenOwner, 0)
	read("journaled", k)

	k = claimA("done")
	complete(m, k, goldenOwner, fenceA, answer)
	read("done", k)

	k = claimA("big")
	complete(m, k, goldenOwner, fenceA, nil)
	read("big", k)

	k = claimA("written-back")
	require.NoError(t, rdb.Del(ctx, k.record).Err()) // evicted mid-run
	complete(m, k, goldenOwner, fenceA, answer)
	read("written-back", k)

	k = claimA("kept")
	require.NoError(t, m.redis.keep(ctx, k, goldenOwner))
	read("kept", k)

	k = claimA("taken-over")
	journal(m, k, goldenOwner, 0)
	takeOver(k)
	read("taken-over", k)

	k = claimA("handed-back")
	journal(m, k, goldenOwner, 0)
	takeOver(k)
	require.NoError(t, taker.redis.release(ctx, k, goldenTaker))
	read("handed-back", k)

	k = claimA("released-after-hand-back")
	journal(m, k, goldenOwner, 0)
	takeOver(k)
	require.NoError(t, taker.redis.release(ctx, k, goldenTaker))
	require.NoError(t, m.redis.release(ctx, k, goldenOwner))
	read("released-after-hand-back", k)

	k = claimA("done-after-takeover")
	takeOver(k)
	complete(taker, k, goldenTaker, fenceB, answer)
	read("done-after-takeover", k)

	k = claimA("resolved")
	require.NoError(t, resolve(ctx, m, settled(k), Answer{Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"order":7}`), Fingerprint: goldenFP}))
	read("resolved", k)

	k = claimA("forgotten")
	require.NoError(t, m.operated().Forget(ctx, settled(k)))
	read("forgotten", k)
	return got
}

func goldenPath(name string) string { return filepath.Join("testdata", "records", name+".txt") }

func TestScriptsWriteTheGoldenRecords(t *testing.T) {
	got := goldenRecords(t)
	if *updateRecords {
		require.NoError(t, os.MkdirAll(filepath.Join("testdata", "records"), 0o755))
		for name, text := range got {
			require.NoError(t, os.WriteFile(goldenPath(name), []byte(text), 0o644))
		}
	}
	for name, text := range got {
		want, err := os.ReadFile(goldenPath(name))
		require.NoError(t, err, "no golden record %s (go test -run TestScriptsWriteTheGoldenRecords -update-records)", name)
		require.Equal(t, string(want), text, "the scripts now write a %s record differently", name)
	}
}

// goldenRecord is a golden file's record with its fences set, as it was
// stored fenceAge ago.
func goldenRecord(t *testing.T, name string, fenceAge time.Duration) string {
	text, err := os.ReadFile(goldenPath(name))
	require.NoError(t, err)
	fence := time.Now().Add(-fenceAge).UnixMicro()
	return strings.NewReplacer(goldenFenceA, strconv.FormatInt(fence, 10),
		goldenFenceB, strconv.FormatInt(fence+1, 10)).Replace(string(text))
}

// Go's codec reads every golden record and writes it back unchanged.
func TestGoldenRecordsRoundTripInGo(t *testing.T) {
	for _, name := range goldenNames(t) {
		text := goldenRecord(t, name, time.Hour)
		r, ok := keyspace.ParseRecord(text)
		require.True(t, ok, name)
		require.Equal(t, text, r.String(), name)
		if r.State == "done" {
			rec, err := decodeRecord(text)
			require.NoError(t, err, name)
			require.Equal(t, http.StatusCreated, rec.status, name)
			require.Equal(t, `{"order":7}`, string(rec.body), name)
		}
	}
}

func goldenNames(t *testing.T) []string {
	files, err := filepath.Glob(goldenPath("*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".txt"))
	}
	return names
}

// The scripts read the golden records as what they are: an answer
// replays, a run whose owner is gone reads interrupted or is taken over
// with its journal, a kept run is interrupted at once, a forgotten record
// is no record.
func TestGoldenRecordsAreRead(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t, "golden-read")
	m := New(rdb, WithKeyPrefix("golden-read"), WithLockLease(time.Minute), WithExecutionTimeout(time.Second))
	taker := New(rdb, WithKeyPrefix("golden-read"), WithLockLease(time.Minute), WithExecutionTimeout(time.Second),
		WithRetryAbandoned())
	claimOf := func(mw *Middleware, name string, age time.Duration) claim {
		k := functionKeys(m, name)
		require.NoError(t, rdb.Set(ctx, k.record, goldenRecord(t, name, age), time.Hour).Err())
		cl, err := mw.redis.claim(ctx, k, "reader-lock", goldenFP)
		require.NoError(t, err, name)
		return cl
	}
	for _, name := range []string{"done", "written-back", "done-after-takeover", "resolved"} {
		cl := claimOf(m, name, time.Hour)
		require.Equal(t, outcomeDone, cl.outcome, name)
		require.Equal(t, http.StatusCreated, cl.rec.status, name)
		require.Equal(t, `{"order":7}`, string(cl.rec.body), name)
	}
	require.Equal(t, outcomeBig, claimOf(m, "big", time.Hour).outcome)
	for _, name := range []string{"claimed", "journaled", "taken-over", "handed-back"} {
		require.Equal(t, outcomeRunning, claimOf(m, name, 0).outcome, "%s: its owner may still store", name)
		require.Equal(t, outcomeAbandoned, claimOf(m, name, time.Hour).outcome, "%s: past the horizon", name)
	}
	for _, name := range []string{"kept", "released-after-hand-back"} {
		require.Equal(t, outcomeAbandoned, claimOf(m, name, 0).outcome, "%s: a kept run stores nothing", name)
	}
	for _, name := range []string{"journaled", "released-after-hand-back"} {
		cl := claimOf(taker, name, 0)
		require.Equal(t, outcomeClaimed, cl.outcome, name)
		require.NotNil(t, cl.journal, name)
		require.Contains(t, *cl.journal, `{"id":"ch_1"}`, "%s: a takeover hands the journal on", name)
	}
	require.Equal(t, outcomeClaimed, claimOf(m, "forgotten", time.Hour).outcome, "a forgotten key runs again")
}

// A record the scripts cannot read, found where the claim's record was
// when the answer is stored (one of a later version's layout, written by
// another executor), is not the executor's: nothing is written over it,
// and the store says the key is no longer its own.
func TestAnUnreadableRecordIsNeverWrittenOver(t *testing.T) {
	ctx := t.Context()
	rdb := redistest.Client(t, "unreadable-over")
	m := New(rdb, WithKeyPrefix("unreadable-over"), WithLockLease(time.Minute))
	for _, text := range []string{
		"done x\n",
		"run " + goldenFP + " other 1796571590400512 1     extra\n", // ten fields
		"done 0 o 1 1 p 2   \n201 0\nbody",
	} {
		k := functionKeys(m, text)
		cl, err := m.redis.claim(ctx, k, goldenOwner, goldenFP)
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, cl.outcome)
		require.NoError(t, rdb.Set(ctx, k.record, text, time.Hour).Err())
		owner := goldenOwner
		_, err = m.redis.complete(ctx, k, &owner, goldenFP, cl.fence, newRecord(http.StatusCreated, nil, []byte("ours")), time.Hour)
		require.ErrorIs(t, err, ErrLockLost, "%q", text)
		got, err := rdb.Get(ctx, k.record).Result()
		require.NoError(t, err)
		require.Equal(t, text, got, "the record is left as it was")
		require.Zero(t, rdb.Exists(ctx, k.lock).Val(), "the executor's lock is freed")
	}
}
