package idempotency

import (
	"strconv"
	"strings"

	"github.com/onceonly/idempotency/internal/keyspace"
)

// A keyRow is one key as the SQL store keeps it: the record, in the one
// layout every store shares (internal/keyspace, lua/ for Redis), with its
// expiry, and the lease beside it: the lock value that holds the key and
// until when. Times are the database's clock, in microseconds, so that
// every instance reads one clock, as every instance reads Redis's.
//
// Its methods are the Go twins of the Redis scripts (lua/), one each, on
// a row the caller read under a lock and writes back when changed: the
// rules are the scripts' own, and each comment says where they differ.
type keyRow struct {
	now         int64  // the database's clock when the row was read
	record      string // the record's text, "" for none (or expired)
	recordUntil int64
	holder      string // the lock value whose lease holds the key, "" for none (or lapsed)
	holderUntil int64
	// waiting: a duplicate waits for the key to be let go (PostgreSQL,
	// where the holder notifies it)
	waiting bool
	changed bool
}

// setRecord writes the record, to live until until.
func (r *keyRow) setRecord(text string, until int64) {
	r.record, r.recordUntil, r.changed = text, until, true
}

// take gives the lease to lockValue for lease microseconds from now.
func (r *keyRow) take(lockValue string, lease int64) {
	r.holder, r.holderUntil, r.changed = lockValue, r.now+lease, true
}

// letGo frees the lease when lockValue holds it.
func (r *keyRow) letGo(lockValue string) {
	if r.holder == lockValue {
		r.holder, r.holderUntil, r.changed = "", 0, true
	}
}

// A claimAsk is what a claim asks of a row (claim.lua's ARGV): the
// caller's lock value and fingerprint, the record's life, how a token
// stands and what becomes of an abandoned run (claimTerms), the horizon
// and the lease, in microseconds.
type claimAsk struct {
	lockValue, fingerprint string
	token, abandoned       string
	life, horizon, lease   int64
	expires                int64 // an issued token's expiry, Unix µs (claimTerms); 0: none
}

// expired reports whether the claim's token can no longer be spent at now
// (the database's clock, which every instance's claims meet; claim.lua's
// ARGV 8).
func (a claimAsk) expired(now int64) bool {
	return a.expires != 0 && now >= a.expires
}

// claim is claim.lua.
func (r *keyRow) claim(a claimAsk) claimFound {
	var rec keyspace.Record
	if r.record != "" {
		var ok bool
		if rec, ok = keyspace.ParseRecord(r.record); !ok {
			return claimFound{word: "corrupt"}
		}
		if rec.State == "forgotten" && a.token == "" {
			rec.State = ""
		}
	}
	lease := func() bool {
		if r.holder == "" {
			r.take(a.lockValue, a.lease)
		}
		return r.holder == a.lockValue
	}
	takeOver := func() claimFound {
		if !lease() {
			return claimFound{word: "held"}
		}
		prevFence, _ := strconv.ParseInt(rec.Fence, 10, 64)
		fence := strconv.FormatInt(max(prevFence+1, r.now), 10)
		executions, err := strconv.Atoi(rec.Executions)
		if err != nil {
			executions = 1
		}
		r.setRecord(keyspace.Record{State: "run", Fingerprint: rec.Fingerprint, Owner: a.lockValue, Fence: fence,
			Executions: strconv.Itoa(executions + 1), PrevOwner: rec.Owner, PrevFence: rec.Fence,
			WrittenBack: rec.WrittenBack, Settled: rec.Settled, Journal: rec.Journal}.String(), r.now+a.life)
		return claimFound{word: "claimed", fence: fence, retaken: true, journal: rec.Journal}
	}
	if rec.State != "" {
		switch {
		case rec.State == "run" && rec.Owner == a.lockValue:
			if !lease() {
				return claimFound{word: "held"}
			}
			if rec.Executions != "1" {
				return claimFound{word: "claimed", fence: rec.Fence, retaken: true, journal: rec.Journal}
			}
			return claimFound{word: "claimed", fence: rec.Fence}
		case rec.State == "forgotten":
			return claimFound{word: "unknown"}
		case rec.Fingerprint != a.fingerprint:
			return claimFound{word: "mismatch"}
		case rec.State != "run" && r.holder != "" && r.holder == rec.Owner:
			// An answer committed in its run's own transaction
			// (StoreAnswerInTx), the run still holding the key: it stores
			// what it sent over that answer as it lets go. A duplicate
			// waits for that, or for the lease to lapse (a crash), so that
			// every replay is the one answer.
			return claimFound{word: "held"}
		case rec.State == "done":
			return claimFound{word: "done", record: r.record, ttl: (r.recordUntil - r.now) / 1000}
		case rec.State == "big":
			return claimFound{word: "big"}
		case r.holder != "" && r.holder == rec.Owner:
			return claimFound{word: "held"}
		case a.abandoned == "1":
			return takeOver()
		}
		fence, _ := strconv.ParseInt(rec.Fence, 10, 64)
		if age := r.now - fence; !strings.HasPrefix(rec.Owner, "!") && age < a.horizon {
			return claimFound{word: "running", horizonIn: (a.horizon - age) / 1000}
		}
		if a.abandoned == "2" {
			return takeOver()
		}
		return claimFound{word: "abandoned"}
	}
	switch {
	case r.holder != "" && r.holder != a.lockValue:
		return claimFound{word: "held"}
	case a.token == "r":
		return claimFound{word: "unknown"}
	case a.expired(r.now):
		return claimFound{word: "expired"}
	}
	lease()
	fence := strconv.FormatInt(r.now, 10)
	r.setRecord(keyspace.Record{State: "run", Fingerprint: a.fingerprint, Owner: a.lockValue, Fence: fence,
		Executions: "1"}.String(), r.now+a.life)
	return claimFound{word: "claimed", fence: fence}
}

// complete is complete.lua: stored is the answer's record, claimed the
// record as the claim wrote it; it returns 1 stored, 2 stored over a
// vanished record, 0 not ours.
func (r *keyRow) complete(lockValue, stored, claimed string, life int64) int {
	result, text := 0, ""
	if r.record != "" && r.record == claimed {
		result, text = 1, stored
	} else {
		rec, ok := keyspace.ParseRecord(r.record)
		ours, _ := keyspace.ParseRecord(stored)
		_, answer, _ := strings.Cut(stored, "\n")
		switch {
		case r.record == "" || (ok && rec.State == "forgotten"):
			result = 2
			text = keyspace.Record{State: ours.State, Fingerprint: ours.Fingerprint, Owner: ours.Owner,
				Fence: ours.Fence, Executions: ours.Executions, WrittenBack: "1"}.String() + answer
		case ok && rec.Owner == lockValue:
			result = 1
			if rec.WrittenBack != "" {
				result = 2
			}
			if rec.State == "run" {
				text = completedText(rec, stored)
			}
		}
	}
	r.letGo(lockValue)
	if text != "" {
		r.setRecord(text, r.now+life)
	}
	return result
}

// completedText is the record of a run, line, completed by stored (a
// store's text): the run's own fields (a takeover's executions and
// previous owner, a write-back's mark), with stored's state and answer.
func completedText(line keyspace.Record, stored string) string {
	ours, _ := keyspace.ParseRecord(stored)
	_, answer, _ := strings.Cut(stored, "\n")
	line.State, line.Journal = ours.State, ""
	line.Status, line.Header, line.Body = "", "", "" // a committed answer's, replaced
	return line.String() + answer
}

// release is release.lua: a takeover goes back to the executor it was
// taken from, a fresh claim's record goes, and a record that earlier
// executors left (a takeover handed back, a journal) is kept.
func (r *keyRow) release(lockValue string) {
	if rec, ok := keyspace.ParseRecord(r.record); ok && rec.State == "run" && rec.Owner == lockValue {
		switch {
		case rec.PrevOwner != "":
			rec.Owner, rec.Fence, rec.PrevOwner, rec.PrevFence = rec.PrevOwner, rec.PrevFence, "", ""
			r.setRecord(rec.String(), r.recordUntil)
		case rec.Executions == "1" && rec.Journal == "":
			r.setRecord("", 0)
		default:
			r.keep(lockValue) // nobody to hand it to: kept, as keep.lua marks a run
		}
	}
	r.letGo(lockValue)
}

// keep is keep.lua: the record stays claimed, its owner marked kept.
func (r *keyRow) keep(lockValue string) {
	if rec, ok := keyspace.ParseRecord(r.record); ok && rec.State == "run" && rec.Owner == lockValue {
		rec.Owner = "!" + lockValue
		r.setRecord(rec.String(), r.recordUntil)
	}
	r.letGo(lockValue)
}

// renew is renew.lua.
func (r *keyRow) renew(lockValue string, lease int64, retake bool) bool {
	switch {
	case r.holder == lockValue:
		r.take(lockValue, lease)
		return true
	case r.holder != "" || !retake:
		return false
	}
	if rec, ok := keyspace.ParseRecord(r.record); !ok || rec.State != "run" || rec.Owner != lockValue {
		return false
	}
	r.take(lockValue, lease)
	return true
}

// step is step.lua: owned 1 (the entry is journaled), 0 (another run's
// record, or none of ours: nothing written), -1 (no record); and the
// milliseconds the lease has left. retake is the lease to take a lapsed
// lock back with, 0 for none.
func (r *keyRow) step(lockValue, entry string, before int, retake int64) (owned int, leftMS int64) {
	lockLeft := func(ours bool) int64 {
		switch {
		case r.holder == lockValue:
			return (r.holderUntil - r.now) / 1000
		case ours && r.holder == "" && retake > 0:
			r.take(lockValue, retake)
			return retake / 1000
		}
		return 0
	}
	if r.record == "" {
		return -1, lockLeft(false)
	}
	rec, ok := keyspace.ParseRecord(r.record)
	if !ok || rec.State != "run" || rec.Owner != lockValue {
		return 0, 0
	}
	switch {
	case entry == "":
	case len(rec.Journal) == before:
		r.setRecord(r.record+entry, r.recordUntil)
	case len(rec.Journal) == before+len(entry) && rec.Journal[before:] == entry:
		// ours, resent after a lost reply
	default:
		return 0, 0
	}
	return 1, lockLeft(true)
}
