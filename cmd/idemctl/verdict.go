package main

import (
	"strings"
	"time"

	"github.com/onceonly/idempotency/admin"
)

// verdict says in one line what a key's state means and what settles it.
// found is nil without -db; claimed is the claim's age, and minAge the
// age under which resolve refuses an interrupted key.
func verdict(st admin.KeyState, found *sqlAnswer, claimed, minAge time.Duration) string {
	key := shellQuote(st.Key)
	switch {
	case st.State == "none" && tokenRecord(st.Key):
		return "no record (never spent, expired, or forgotten): a retry with this token is answered 422 " +
			"token-not-found, unless the token was never spent and is still valid, which spends it and runs the handler"
	case st.State == "none":
		return "no record (never claimed, expired, or forgotten): a retry runs the handler"
	case st.State == "done":
		return "done: every retry is replayed the stored answer"
	case st.State == "big":
		return "executed: retries are answered 409 not-replayable until the record expires"
	case st.State == "corrupt":
		return "unreadable: retries are answered 409 unreadable-record until the record expires, and nothing runs again"
	case st.State == "run" && st.Lock == st.Owner:
		return "running: wait for its executor to store an answer"
	case !st.Interrupted:
		return "maybe still running: claimed " + age(claimed) + ", its lock lapsed (a stall of the store, a pause), " +
			"and its executor may still store its answer until the claim horizon (its execution timeout, a lease and " +
			"its store's tries after the claim). Look again later; resolve refuses it until then, even with -force"
	case claimed < minAge:
		return "maybe still running: claimed " + age(claimed) + ", under -min-age " + minAge.String() +
			", and an executor whose lease lapsed (a stall of the store, a pause) looks interrupted until its " +
			"execution timeout ends it. Look again later; resolve refuses it until then, unless -force"
	case found == nil:
		return "interrupted; its outcome is unknown. If it took effect and SQL committed its answer, " +
			"`idemctl -db DSN resolve -replay " + key + "` replays it; if it had no effect, " +
			"`idemctl resolve -forget " + key + "` lets a retry run again"
	case found.committed(st):
		return "interrupted; SQL holds a committed answer: `idemctl resolve -replay " + key + "` replays it"
	case found.found && found.row.Done:
		return "interrupted; SQL's answer is another request's under the same key, so it cannot be replayed: " +
			"find out whether this request took effect before `idemctl resolve -forget " + key + "`"
	}
	return "interrupted; SQL holds no committed answer: if the route commits through sqlidem, it had no effect, " +
		"and `idemctl resolve -forget " + key + "` lets a retry run again"
}

// shellQuote quotes s for a POSIX shell, so that a suggested command can
// be pasted whatever the prefix holds.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
