package main

import (
	"bytes"
	"fmt"
	"strings"
)

// A mutant is one small edit that breaks one promise of the middleware.
type mutant struct {
	name   string
	file   string // the file it changes, from the root of the tree
	from   string // text that occurs exactly once in the file
	to     string // what it becomes
	breaks string // the promise the edit breaks, as a user would state it
	// faults aims the fault checker (its -idem.faults): the kinds of fault
	// under which the broken promise shows. steps runs the checker of
	// resumable steps (TestFaultCheckSteps, whose kinds are kill,
	// redis-stop, blackhole, drop-reply and pause; all of them unless
	// faults names some) instead of TestFaultCheck.
	faults string
	steps  bool
	// sql runs the fault checker on that SQL database (TestFaultCheckSQL's
	// subtest, or TestFaultCheckStepsSQL's with steps: "sqlite", "postgres"
	// or "mysql") instead of on Redis.
	sql string
	// tests is the -run pattern of the unit tests that guard the line, in
	// module (a folder of the tree; "" for the root), over pkgs (default
	// "./" of the module).
	tests  string
	module string
	pkgs   []string
	// unseen says why no interleaving of the fault checker can show the
	// mutant: the checker does not run it, and the unit tests must kill it.
	unseen string
}

// apply makes the edit, refusing a list entry whose text is not found, or
// found more than once: a mutant whose line moved is rewritten, never
// silently dropped.
func (m mutant) apply(src []byte) ([]byte, error) {
	switch n := bytes.Count(src, []byte(m.from)); n {
	case 1:
		return bytes.Replace(src, []byte(m.from), []byte(m.to), 1), nil
	case 0:
		return nil, fmt.Errorf("%s: the text to change is not in %s any more: rewrite the mutant", m.name, m.file)
	default:
		return nil, fmt.Errorf("%s: the text to change occurs %d times in %s: make it unique", m.name, n, m.file)
	}
}

// checker is the -test.run pattern of the fault checker for m.
func (m mutant) checker() string {
	switch {
	case m.steps && m.sql != "":
		return "^TestFaultCheckStepsSQL$/^" + m.sql + "$"
	case m.steps:
		return "^TestFaultCheckSteps$"
	case m.sql != "":
		return "^TestFaultCheckSQL$/^" + m.sql + "$"
	}
	return "^TestFaultCheck$"
}

func (m mutant) packages() []string {
	if len(m.pkgs) == 0 {
		return []string{"./"}
	}
	return m.pkgs
}

// Fault kinds the mutants aim at (internal/faultcheck/plan_test.go).
const (
	redisFaults  = "redis-stop,drop-reply,delay,blackhole,kill"
	clientFaults = "disconnect,client-deadline,impostor"
	claimFaults  = redisFaults + "," + clientFaults
)

// retakeUnseen is why the fault checker cannot show a mutant of renew.lua:
// a lock is retaken only where no other executor may take the key over
// (without WithRetryAbandoned), and there a run whose lock lapsed reads
// running until its claim horizon, which outlasts the run, whether or not
// its lock is back: the retake spares claims a wait, and no answer changes.
const retakeUnseen = "without a takeover a lapsed run reads running until its claim horizon, retaken or not: no answer changes"

// mutants is the list, grouped by what they break.
var mutants = []mutant{
	// claim.lua: the claim, the fence, takeover and tokens.
	{
		name: "claim-fingerprint-ignored", file: "lua/claim.lua",
		from: "elseif fp ~= ARGV[2] then", to: "elseif false and fp ~= ARGV[2] then",
		breaks: "a request with another body gets the stored answer of the key's first request",
		faults: "impostor", tests: "Mismatch|KeyReused|Fingerprint",
	},
	{
		name: "claim-resend-not-recognised", file: "lua/claim.lua",
		from: "if st == 'run' and o == ARGV[1] then", to: "if st == 'run' and o == '' then",
		breaks: "a claim resent after its reply was lost is refused as another's, and its request waits on itself",
		faults: "drop-reply", tests: "Resen|LostReply|Dropped",
	},
	{
		name: "claim-ignores-horizon", file: "lua/claim.lua",
		from: "age < tonumber(ARGV[6]) * 1000", to: "age < 0",
		breaks: "a key whose executor may still store its answer is answered interrupted",
		faults: "takeover,blackhole", tests: "Horizon|Abandoned|Interrupted|Stall",
	},
	{
		name: "claim-record-short-ttl", file: "lua/claim.lua",
		from:   "recordLine('run', ARGV[2], ARGV[1], fence, '1', '', '', '', ''), 'PX', ARGV[3])",
		to:     "recordLine('run', ARGV[2], ARGV[1], fence, '1', '', '', '', ''), 'PX', 300)",
		breaks: "a running key's record expires under it, and a retry runs the handler again",
		faults: "kill,redis-stop,impostor", tests: "Record|TTL|Claim",
	},
	{
		name: "claim-takes-no-lock", file: "lua/claim.lua",
		from: "if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[7])", to: "if not true",
		breaks: "a claim runs its handler without the key's lock, and a duplicate on another instance finds the key free to take over or abandoned",
		faults: "takeover,impostor", tests: "Takeover|Abandoned|Lock|Lease|Concurrent",
	},
	{
		name: "claim-takeover-takes-no-lock", file: "lua/claim.lua",
		from: "    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[7])", to: "    -- no lock",
		breaks: "a takeover runs without the key's lock, and a third executor takes the key over from it",
		faults: "takeover,kill", tests: "Takeover|Abandoned|Retake|Concurrent",
	},
	{
		name: "claim-fence-not-above", file: "lua/claim.lua",
		from: "local fence = string.format('%.0f', math.max((tonumber(f) or 0) + 1,", to: "local fence = f or string.format('%.0f', math.max((tonumber(f) or 0) + 1,",
		breaks: "a takeover runs under the fencing token of the executor it took the key from",
		faults: "takeover,blackhole", tests: "Fenc|Takeover|Abandoned|Retake",
	},
	{
		name: "claim-spends-retired-token", file: "lua/claim.lua",
		from: "if ARGV[4] == 'r' then", to: "if ARGV[4] == '-' then",
		breaks: "a token of a revoked key that was never spent is spent",
		faults: "revoke", tests: "Token|Revoked",
	},
	{
		name: "claim-spends-expired-token", file: "lua/claim.lua",
		from: "if expired then", to: "if false then",
		breaks: "an expired token is spent",
		tests:  "Token|Expir",
		unseen: "a history's tokens live far longer than the history, so none expires in it",
	},
	{
		name: "claim-expiry-by-the-instance", file: "lua/claim.lua",
		from: "expired = tonumber(now[1])", to: "expired = false and tonumber(now[1])",
		breaks: "a token's claim sent in time that reaches Redis after the token expired spends it, after another instance answered token-expired (nothing ran)",
		tests:  "Token|Expir",
		unseen: "a history's tokens live far longer than the history, so none expires in it",
	},
	// complete.lua: storing the answer.
	{
		name: "complete-over-another", file: "lua/complete.lua",
		from: "elseif o == ARGV[1] then", to: "else",
		breaks: "an executor whose key was taken over stores its answer over the new executor's",
		faults: "takeover,blackhole", tests: "Complete|Takeover|Abandoned|Store|Settle|StaleExecutor",
	},
	{
		name: "complete-no-wakeup", file: "lua/complete.lua",
		from: "  redis.call('PUBLISH', KEYS[3], 'done')", to: "  -- no message",
		breaks: "a duplicate waiting on another instance is not woken by the answer, and times out in progress",
		faults: "impostor,disconnect", tests: "Wait|Publish|Duplicate",
	},
	{
		name: "complete-forgets-writeback", file: "lua/complete.lua",
		from: "    stored, text = 2, recordLine(ourState, ourFP, ourOwner, ourFence, ourExecutions, '', '', '1', '') ..\n" +
			"      string.sub(ARGV[2], answer)",
		to:     "    stored = 2",
		breaks: "an answer whose record vanished while the handler ran is not written back, and a retry runs again",
		faults: "redis-restart", tests: "Vanish|WriteBack|Written|Rewritten",
	},
	// record.lua: the record's layout, which every script above is built with.
	{
		name: "record-forgets-previous-owner", file: "internal/keyspace/lua/record.lua",
		from: "executions .. ' ' .. prevOwner .. ' ' ..", to: "executions .. ' ' .. '' .. ' ' ..",
		breaks: "a takeover forgets whom it took the key from, and undoing it keeps the key from the executor it was taken from, which may still store",
		faults: "takeover,drop-reply", tests: "Golden|Release|Takeover|Undo|HandBack|Abandoned",
	},
	// release.lua and keep.lua: letting a key go.
	{
		name: "release-frees-takeover", file: "lua/release.lua",
		from: "if p ~= '' then\n", to: "if p ~= '' then\n      redis.call('DEL', KEYS[1])\n    elseif false then\n",
		breaks: "undoing a takeover frees the key, although the executor it was taken from may have taken effect",
		faults: "takeover,drop-reply", tests: "Release|Takeover|Undo|HandBack|Abandoned",
	},
	{
		name: "release-frees-handed-back", file: "lua/release.lua",
		from: "elseif n == '1' and j > #rec then", to: "elseif true then",
		breaks: "the late undo of a takeover, handed the key back by the undo of a takeover of it, frees the key, and a fresh claim runs the first run's journaled steps again",
		faults: "lost-takeovers", steps: true, tests: "Golden|Undone|HandBack|Takeover",
	},
	{
		name: "release-anyones-record", file: "lua/release.lua",
		from: "  if st == 'run' and o == ARGV[1] then", to: "  if st == 'run' then",
		breaks: "a stale executor's release deletes the record of the execution that owns the key now",
		faults: redisFaults + ",release,panic-before", tests: "Release|Stale|Takeover|AnotherExecutors",
	},
	{
		name: "keep-unmarked", file: "lua/keep.lua",
		from: "recordLine(st, fp, '!' .. o,", to: "recordLine(st, fp, o,",
		breaks: "a key kept without an answer reads in progress until the claim horizon instead of interrupted",
		faults: "panic-after,deadline,outer-timeout,do-cutoff", tests: "Keep|Interrupted|Kept",
	},
	// renew.lua and the watchdog: renewal.
	{
		name: "retake-from-holder", file: "lua/renew.lua",
		from: "if holder then\n  return 0\nend", to: "if false then\n  return 0\nend",
		breaks: "a lapsed executor takes the lock from a claim that holds it",
		tests:  "TestALapsedLockIsRetakenOnlyByTheRunItsRecordNames",
		unseen: retakeUnseen,
	},
	{
		name: "retake-after-takeover", file: "lua/renew.lua",
		from: "if st ~= 'run' or o ~= ARGV[1] then\n  return 0\nend", to: "if false then\n  return 0\nend",
		breaks: "a lapsed executor takes back the lock of a key whose record names another run",
		tests:  "TestALapsedLockIsRetakenOnlyByTheRunItsRecordNames",
		unseen: retakeUnseen,
	},
	// later.go: what Redis did not take at once.
	{
		name: "later-every-job-tries", file: "later.go",
		from: "case q.probing || time.Now().Before(q.notBefore):", to: "case false:",
		breaks: "while the store fails, every queued job tries on its own pause, and a store coming back (a database whose queue of new connections fills) is kept down by the retries",
		tests:  "TestAFailingStoreIsTriedByOneJobAtATime",
		unseen: "the fault checker judges answers, not how often a failing store is tried; its outages end on their own",
	},
	{
		name: "watchdog-never-renews", file: "watchdog.go",
		from: "wd.timer = time.AfterFunc(first, wd.renew)", to: "wd.timer = time.AfterFunc(first+time.Hour, wd.renew)",
		breaks: "a slow handler's lease is not renewed, and its key is taken over while it runs",
		faults: "takeover,impostor", tests: "Watchdog|Renew|Lease|Slow",
	},
	{
		name: "watchdog-renews-late", file: "watchdog.go",
		from: "next := wd.lease / 3", to: "next := 2 * wd.lease",
		breaks: "a lease is renewed after it ran out, and a slow handler's key is taken over while it runs",
		faults: "takeover", tests: "Watchdog|Renew|Lease|Slow",
	},
	// step.lua and the journal: resumable steps.
	{
		name: "step-journals-for-stale", file: "lua/step.lua",
		from: "if st ~= 'run' or o ~= ARGV[1] then\n  return {0, 0}\nend", to: "if false then\n  return {0, 0}\nend",
		breaks: "an executor whose run was taken over journals a step into the new run",
		steps:  true, faults: "pause", tests: "Step|Journal|Resum",
	},
	{
		name: "step-proof-overstated", file: "lua/step.lua",
		from: "if holder == ARGV[1] then\n    return redis.call('PTTL', KEYS[2])", to: "if holder == ARGV[1] then\n    return 60000",
		breaks: "a journal write proves the run its key for longer than its lock lasts, and a paused executor runs a step after a takeover",
		steps:  true, faults: "pause", tests: "Paused|Proof|Proven|StepCost",
	},
	{
		name: "step-runs-again", file: "step.go",
		from: "\tcase e != nil:\n\t\treturn replayStep[T](x.resultCodec(), e)", to: "\tcase e != nil && false:\n\t\treturn replayStep[T](x.resultCodec(), e)",
		breaks: "a resumed run runs a step again that the journal holds",
		steps:  true, tests: "Step|Journal|Resum",
	},
	{
		name: "step-without-proof", file: "step.go",
		from: "if err := j.prove(ctx, name); err != nil {", to: "if err := j.prove(ctx, name); err != nil && false {",
		breaks: "an executor paused past its lease runs a step of a run that another took over",
		// Only pauses: a history with other faults seldom pauses an
		// executor past its lease while a retry takes its key over.
		steps: true, faults: "pause", tests: "Paused|Proof|Proven|Step",
	},
	{
		name: "step-again-in-next-attempt", file: "step.go",
		from: "\tcase done != nil:\n\t\treturn doneStep[T](name, done)", to: "\tcase done != nil && false:\n\t\treturn doneStep[T](name, done)",
		breaks: "a transaction run again after an abort repeats a step its earlier attempt finished",
		tests:  "Aborted|NextAttempt|Attempt", module: "sqlidem/internal/servertest",
		unseen: "the steps fault checker runs no transaction that the database aborts; sqlidem's tests abort one",
	},
	{
		name: "step-after-cutoff", file: "step.go",
		from: "if cut := cutOff(x.run); cut != nil {", to: "if cut := cutOff(x.run); cut != nil && false {",
		breaks: "a run cut off (its key may be resumed elsewhere) starts another step",
		tests:  "Step|Cut|Resum",
		unseen: "a step proves in Redis that its run owns the key before it starts: a cut-off run that starts one still owns it (the step is journaled for the resume) or is refused; the check spares the round trip",
	},
	// releaserule.go: the release rule, row by row.
	{
		name: "rule-panic-after-status-releases", file: "releaserule.go",
		from:   "if !e.committed && e.cut == nil && !e.tookEffect {",
		to:     "if e.cut == nil && !e.tookEffect {",
		breaks: "a handler that panics after its status went out has its key released, and a retry runs again",
		faults: "panic-after", tests: "Panic|TheReleaseRule",
	},
	{
		name: "rule-panic-before-keeps", file: "releaserule.go",
		from:   "if !e.committed && e.cut == nil && !e.tookEffect {",
		to:     "if false && !e.committed && e.cut == nil && !e.tookEffect {",
		breaks: "a handler that panics before any effect or status keeps its key interrupted, though nothing ran",
		faults: "panic-before", tests: "Panic|TheReleaseRule",
	},
	{
		name: "rule-release-after-steps", file: "releaserule.go",
		from: "case (e.released || e.policyReleases) && e.tookEffect:", to: "case false && e.tookEffect:",
		breaks: "a run that journaled steps releases its key, and a retry repeats their effects",
		steps:  true, tests: "Step|Release|Resum|TheReleaseRule",
	},
	{
		name: "rule-cutoff-releases", file: "releaserule.go",
		from:   "case e.cut != nil && (e.policyReleases || !e.succeeded):\n\t\treturn fateKeep, e.cut",
		to:     "case e.cut != nil && (e.policyReleases || !e.succeeded):\n\t\treturn fateRelease, nil",
		breaks: "a run cut off by its execution timeout or a lost lease releases its key, though it may still take effect",
		faults: "do-cutoff,deadline,outer-timeout", tests: "Cut|Timeout|Deadline|Keep|TheReleaseRule",
	},
	{
		name: "rule-released-work-stored", file: "execution.go",
		from:   "released := e.state.CompareAndSwap(execRunning, execReleased) || e.state.Load() == execReleased",
		to:     "released := false",
		breaks: "a handler that calls Release gives nothing up: its refusal is stored, and the fixed retry gets it again",
		faults: "release", tests: "Release",
	},
	{
		name: "rule-store-failure-dropped", file: "lifecycle.go",
		from:   "\t\tl.storeLater(rec, ttl)\n\t\treturn verdict{outcome: Executed, err: err}",
		to:     "\t\treturn verdict{outcome: Executed, err: err}",
		breaks: "an answer Redis did not take is dropped instead of stored from the background",
		faults: "redis-stop,blackhole,drop-reply", tests: "Background|Later|Store|Outage",
	},
	{
		name: "rule-release-not-retried", file: "lifecycle.go",
		from: "\tif err != nil {\n\t\tl.releaseLater()\n\t}", to: "\t_ = err",
		breaks: "a release Redis did not answer is not retried, and the key stays claimed though nothing ran",
		faults: "release,panic-before,do-error,redis-stop,blackhole", tests: "Release|Later|Outage",
	},
	{
		name: "rule-do-error-kept", file: "do.go",
		from:   "return StoreDecision{Release: f.err != nil && !f.cfg.storeErrors, TTL: f.m.cfg.recordTTL}",
		to:     "return StoreDecision{Release: false, TTL: f.m.cfg.recordTTL}",
		breaks: "a function of Do that fails before any effect keeps its key, and the retry never runs it again",
		faults: "do,do-error", tests: "Do",
	},
	// The operator's scripts (internal/keyspace).
	{
		name: "settle-running-key", file: "internal/keyspace/lua/settle.lua",
		from: "if redis.call('GET', KEYS[2]) == o then\n  return 'running'", to: "if false then\n  return 'running'",
		breaks: "an operator's resolve or forget settles a key whose executor still holds it",
		tests:  "TestResolve|TestForget|Operator|Settle",
		unseen: "the fault checker's histories have no operator; the admin tests settle live keys",
	},
	{
		name: "settle-young-key", file: "internal/keyspace/lua/settle.lua",
		from:   "if tonumber(t[1]) * 1000000 + tonumber(t[2]) - (tonumber(f) or 0) < tonumber(ARGV[4]) * 1000 then",
		to:     "if false then",
		breaks: "an operator's resolve or forget settles a key whose lock lapsed under a live executor, before the claim horizon: a forget runs it twice, a resolve gives its retries another answer than its caller got",
		tests:  "TestAResolvedKeyIsNotTheStalledExecutors",
		unseen: "the fault checker's histories have no operator",
	},
	{
		name: "sql-settle-young-key", file: "internal/keyspace/sqlrows.go",
		from:   "case mayStillStore(rec.Owner, fenceOf(rec), r.now, a.horizon):",
		to:     "case false:",
		breaks: "on SQL, an operator's resolve or forget settles a key whose lease lapsed under a live executor, before the claim horizon",
		tests:  "TestSQLSettle", pkgs: []string{"./internal/keyspace/"},
		unseen: "the fault checker's histories have no operator",
	},
	{
		name: "inspect-ignores-horizon", file: "internal/keyspace/store.go",
		from:   "return s.State == \"run\" && s.Lock != s.Owner && !mayStillStore(s.Owner, int64(s.Fence), now, horizon)",
		to:     "return s.State == \"run\" && s.Lock != s.Owner",
		breaks: "an operator is shown as interrupted, and offered to settle, a key whose lock lapsed under a live executor, before the claim horizon",
		tests:  "TestAResolvedKeyIsNotTheStalledExecutors|TestSQLSettle", pkgs: []string{"./", "./internal/keyspace/"},
		unseen: "the fault checker's histories have no operator, and it judges keys by their lock",
	},
	{
		name: "inspect-swaps-fence", file: "internal/keyspace/lua/inspect.lua",
		from: "st, fp, o, f, n, _, _, _, _, meta = readRecord(rec)", to: "st, fp, o, n, f, _, _, _, _, meta = readRecord(rec)",
		breaks: "inspecting a key shows its execution count as its fencing token",
		faults: "impostor", tests: "Inspect", pkgs: []string{"./admin/", "./internal/keyspace/"},
	},
	// Waiters, the cache, the fingerprint and the caller's scope.
	{
		name: "waiter-ignores-wakeup", file: "waiter.go",
		from: "\tcase <-w.woken:\n\tcase <-timer.C:", to: "\tcase <-timer.C:",
		breaks: "a duplicate waiting on another instance sleeps past the answer instead of waking",
		faults: "impostor,disconnect", tests: "Wait|Wake|Duplicate",
	},
	{
		name: "flight-follows-other-body", file: "serve.go",
		from: "\t\tcase fl.fp != c.fp:\n", to: "\t\tcase false:\n",
		breaks: "a request with another body waits for the key's request running in this process, instead of 422 at once",
		tests:  "TestAnotherBodyIsRefusedAtOnceWhileTheKeyRunsHere|TestEveryReplayPathChecksTheFingerprint",
		unseen: "a follower's replay checks its own fingerprint (replay.go): a request with another body still gets 422 key-reused, only later; the checker does not time refusals",
	},
	{
		name: "fingerprint-ignores-body", file: "fingerprint.go",
		from: "\tb := appendDefault((*bp)[:0], r, body)\n", to: "\tb := appendDefault((*bp)[:0], r, nil)\n",
		breaks: "two requests with different bodies under one key count as the same request",
		faults: "impostor", tests: "Fingerprint|Mismatch|KeyReused",
	},
	{
		name: "token-mac-ignores-scope", file: "tokensign.go",
		from: "mac.Write([]byte(scope))", to: "mac.Write(nil)",
		breaks: "a token issued to one session is spent by another, whose request runs as its own",
		tests:  "Token|Scope|Session",
		unseen: "the fault checker's callers never present a token issued to another caller",
	},
	{
		name: "ring-spends-revoked", file: "tokensign.go",
		from: "return tokenCheck{expires: expires, state: tokenRevoked}", to: "return tokenCheck{expires: expires, state: tokenValid}",
		breaks: "a token of a revoked key that was never spent is spent",
		faults: "revoke", tests: "Token|Revoked",
	},
	{
		name: "ring-forgets-revoked", file: "tokensign.go",
		from: "for _, key := range s.keys.Revoked {", to: "for _, key := range s.keys.Revoked[:0] {",
		breaks: "a form spent before its key was revoked is told token-not-found, and the form orders again",
		faults: "revoke", tests: "Token|Revoked",
	},
	{
		name: "ring-ignores-accepted", file: "tokensign.go",
		from: "for _, key := range s.keys.Accept {", to: "for _, key := range s.keys.Accept[:0] {",
		breaks: "during a rotation, a token signed by the other key is told token-not-found, and later spent elsewhere",
		tests:  "Token|Rotation",
		unseen: "the fault checker's rings change by revocation only, never by a rotation",
	},
	{
		name: "identity-ignores-scope", file: "keys.go",
		from: "\t\tkind = 't'\n\t}\n\treturn identityOfKind(kind, scope, key)", to: "\t\tkind = 't'\n\t}\n\treturn identityOfKind(kind, \"\", key)",
		breaks: "two callers who send the same key share one record, and one gets the other's answer",
		faults: "impostor", tests: "Scope|Caller|Identity",
	},
	// The outcome store in SQL.
	{
		name: "sql-recovery-fence-ignored", file: "sqlidem/store.go",
		from: "AND state = 'fenced' AND fence <= ?\")", to: "AND state = 'fenced' AND fence >= 0 AND 0 <= ?\")",
		breaks: "an executor fenced out by a recovery still commits its answer over the fence",
		tests:  "Fence|Recover|Stale|Abandon", module: "sqlidem/internal/servertest",
		unseen: "the fault checker's instances run no outcome store; sqlidem's crash trials and unit tests hold it",
	},
	{
		name: "sql-claim-fingerprint-ignored", file: "sqlrow.go",
		from: "case rec.Fingerprint != a.fingerprint:", to: "case false && rec.Fingerprint != a.fingerprint:",
		breaks: "on SQL, a request with another body gets the stored answer of the key's first request",
		faults: "impostor", sql: "sqlite", tests: "TestStoreConformanceSQL", module: "internal/sqlstoretest",
	},
	{
		name: "sql-claim-expiry-by-the-instance", file: "sqlrow.go",
		from: `return a.expires != 0 && now >= a.expires`, to: `return false && now >= a.expires`,
		breaks: "on SQL, a token's claim sent in time that reaches the database after the token expired spends it, after another instance answered token-expired (nothing ran)",
		tests:  "Expir", module: "internal/sqlstoretest",
		unseen: "a history's tokens live far longer than the history, so none expires in it",
	},
	{
		name: "sql-claim-resend-not-recognised", file: "sqlrow.go",
		from: `case rec.State == "run" && rec.Owner == a.lockValue:`, to: `case rec.State == "run" && rec.Owner == "":`,
		breaks: "on SQL, a claim read again is refused as another's (on MySQL after every fresh INSERT, anywhere after a lost reply), and its request waits on itself",
		faults: "drop-reply,db-restart", sql: "mysql", tests: "TestStoreConformanceSQL|LostReply|Resen", module: "internal/sqlstoretest",
	},
	{
		name: "sql-store-keeps-lease", file: "sqlstore.go",
		from:   "n, err := s.changeRow(ctx, c, s.q.store, stored, life, *lockValue, *lockValue, k.record, claimed)",
		to:     `n, err := s.changeRow(ctx, c, s.q.store, stored, life, "", "", k.record, claimed)`,
		breaks: "on SQL, storing the answer keeps the key's lease, and a duplicate waits for the lease to lapse before it replays the answer",
		faults: "impostor", sql: "postgres", tests: "TestStoreConformanceSQL", module: "internal/sqlstoretest",
	},
	{
		name: "sql-live-lease-read-lapsed", file: "sqlstore.go",
		from: "if r.holderUntil <= r.now {", to: "if r.holderUntil <= r.now+int64(time.Minute/time.Microsecond) {",
		breaks: "on SQL, a key whose executor holds its lease is taken over, and runs twice",
		faults: "takeover,blackhole,kill,impostor", sql: "postgres",
		tests: "TestRenewedLeaseKeepsALongRunsKey|TestStoreConformanceSQL", module: "internal/sqlstoretest",
	},
	{
		name: "sql-release-frees-takeover", file: "sqlrow.go",
		from: `case rec.PrevOwner != "":`, to: "case rec.PrevOwner != \"\":\n\t\t\tr.setRecord(\"\", 0)\n\t\tcase false:",
		breaks: "on SQL, undoing a takeover frees the key instead of handing it back to the executor it was taken from",
		faults: "takeover", sql: "postgres", tests: "TestRowsWriteTheGoldenRecords",
	},
	{
		name: "sql-release-frees-handed-back", file: "sqlrow.go",
		from: `case rec.Executions == "1" && rec.Journal == "":`, to: `case true:`,
		breaks: "on SQL, the late undo of a takeover, handed the key back by the undo of a takeover of it, frees the key, and a fresh claim runs the first run's journaled steps again",
		tests:  "TestUndoneTakeovers|TestRowsWriteTheGoldenRecords|TestAReleaseOfAnotherExecutorsRunChangesNothing",
		unseen: "the SQL checker cannot aim a lost reply at a takeover: on the wire its statements are any claim's " +
			"(pgx sends cached statements by name), and SQLite has no connection to lose one on; the unit tests drive the chain",
	},
	{
		name: "sql-keep-not-marked", file: "sqlrow.go",
		from: `rec.Owner = "!" + lockValue`, to: `rec.Owner = lockValue`,
		breaks: "on SQL, a kept run is not marked, and its key waits out the claim horizon before it reads interrupted",
		faults: "blackhole,db-stall,db-restart,drop-reply,kill", sql: "postgres", tests: "TestRowsWriteTheGoldenRecords",
	},
	{
		name: "sql-step-not-journaled", file: "sqlrow.go",
		from: "r.setRecord(r.record+entry, r.recordUntil)", to: "r.setRecord(r.record, r.recordUntil)",
		breaks: "on SQL, a step's result is reported journaled but not written, and a run that resumes the key runs the step again",
		faults: "kill,pause", steps: true, sql: "sqlite", tests: "TestStoreConformanceSQL", module: "internal/sqlstoretest",
	},
	{
		name: "sql-tx-answer-ignores-owner", file: "sqltx.go",
		from: "if r.complete(lockValue, stored, claimed, life) == 0 {", to: "if r.complete(lockValue, stored, claimed, life) == 0 && false {",
		breaks: "on SQL, a run whose key was taken over still commits its writes and its answer in the handler's transaction",
		tests:  "TestAnswerOfAKeyNoLongerOursRollsBack|TestAnswerCommitsWithTheHandlersWrites", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests hold the transaction",
	},
	{
		name: "sql-tx-answer-not-stored", file: "sqlidem/commit.go",
		from: "if err := idempotency.StoreAnswerInTx(ctx, s.db, tx, answer); err != nil {", to: "if err := error(nil); err != nil {",
		breaks: "on SQL with sqlidem, the key's answer is not committed with the handler's writes, and a crash between the two leaves the key claimed",
		tests:  "TestAnswerCommitsWithTheHandlersWrites|TestAnswerOfAKeyNoLongerOursRollsBack", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests hold the transaction",
	},
	{
		name: "sqlidem-ended-connection-is-handlers-error", file: "sqlidem/commit.go",
		from: "\t\tif ended(ctx, conn, err) {", to: "\t\tif false && ended(ctx, conn, err) {",
		breaks: "a handler whose connection the database ended is answered 500 internal, as its own failure, not 503 store-unavailable",
		tests:  "TestAHandlersEndedConnectionIsStoreUnavailable", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests kill a handler's connection",
	},
	{
		name: "sqlidem-stops-at-an-ended-idle-connection", file: "sqlidem/conn.go",
		from: "if !gone || attempt == 3 || ctx.Err() != nil {", to: "if _ = gone; true {",
		breaks: "an outcome store that meets a pooled connection the server ended while idle answers 503 on a healthy database",
		tests:  "TestAHandlerMovesPastAKilledIdleConnection", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests kill idle connections",
	},
	{
		name: "sqlidem-own-timeout-is-the-databases", file: "sqlidem/ended.go",
		from:   "case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):\n\t\treturn false",
		to:     "case errors.Is(err, context.Canceled) && false:\n\t\treturn false",
		breaks: "a handler that gave up on its own statement (its own timeout) is answered 503 store-unavailable, not with its own answer",
		tests:  "TestAHandlersOwnFailureIsItsOwnAnswer", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests time a handler's statement out",
	},
	{
		name: "sqlidem-end-not-confirmed", file: "sqlidem/ended.go",
		from: "\treturn gone(ctx, conn)\n}", to: "\treturn true || gone(ctx, conn)\n}",
		breaks: "a handler whose other connection failed (another database, dblink, a foreign table) is answered 503 store-unavailable, not with its own answer",
		tests:  "TestAHandlersOwnFailureIsItsOwnAnswer", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests fail a handler's other connections",
	},
	{
		name: "sql-committed-answer-replayed-early", file: "sqlrow.go",
		from: `case rec.State != "run" && r.holder != "" && r.holder == rec.Owner:`, to: `case false && rec.State != "run" && r.holder != "" && r.holder == rec.Owner:`,
		breaks: "on SQL with sqlidem, a duplicate between the commit and the middleware's store replays the committed answer, not what the first caller got",
		tests:  "TestAnswerCommitsWithTheHandlersWrites", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances run no outcome store; the SQL store's tests hold the transaction",
	},
	{
		name: "sql-line-kept-for-good", file: "sqlline.go",
		from: "\tl.refresh(db)\n", to: "\n",
		breaks: "on SQL, the connection kept for running keys lives for as long as keys run, past SetConnMaxLifetime, on a server a failover made a replica",
		tests:  "TestTheLineFollowsThePoolsConnectionLifetime", module: "internal/sqlstoretest",
		unseen: "the fault checker's instances set no connection lifetime, and a connection that lives on changes no answer",
	},
	{
		name: "sql-line-without-spare", file: "sqlline.go",
		from:   "\tminSparePool = 6\n",
		to:     "\tminSparePool = 1 << 30\n",
		breaks: "on SQL, when the server ends the connection kept for running keys while handlers hold every other one, renewals wait for the pool, leases lapse under live runs, and WithRetryAbandoned runs the keys again",
		tests:  "TestTheLinesSpareOutlivesItsConnection", module: "internal/sqlstoretest",
		unseen: "the fault checker's handlers hold no connection of the pool",
	},
	{
		name: "sql-line-never-filled", file: "sqlline.go",
		from:   "\treturn l.want.Load() && l.want.CompareAndSwap(true, false)\n",
		to:     "\treturn false\n",
		breaks: "on SQL, the store keeps no connection for running keys: while handlers' transactions hold every connection of the pool, renewals wait behind them, leases lapse under live runs, and WithRetryAbandoned runs the keys again",
		tests:  "TestLeasesOutlastAPoolFullOfHandlers|TestTheLineFillsAgainFromTheNextConnection|TestTheLinesSpareOutlivesItsConnection", module: "internal/sqlstoretest",
		unseen: "the fault checker's handlers hold no connection of the pool",
	},
	{
		name: "sql-holder-waits-for-the-pool", file: "sqlline.go",
		from:   "\t\tif done, err := s.line.onPool(ctx, s.db, holderPoolWait(s.cfg.lease), op); done {\n\t\t\treturn poolNamed(s.db, err)\n\t\t}\n",
		to:     "\t\treturn poolNamed(s.db, op(s.db))\n",
		breaks: "on SQL, a renewal waits for a new connection the database is slow to open, or for one a handler's transaction took first, past its lease, and another instance takes the key over from a live run",
		tests:  "TestLeasesOutlastSlowNewConnections", module: "internal/sqlstoretest",
		unseen: "the fault checker's database opens its connections at the machine's pace and its handlers hold none",
	},
	{
		name: "sql-waiters-never-notified", file: "sqlstatements.go",
		from: `"WHERE u.waiting_until > " + now + ") n ON true"`, to: `"WHERE u.waiting_until > " + now + " AND false) n ON true"`,
		breaks: "on PostgreSQL with a listener, a waiting duplicate is not told when the key's holder lets go, and waits for its next poll",
		tests:  "TestWaitingDuplicateIsNotified|TestListenerConnectsAgain|TestListenerTakesNoPooledConnection", module: "internal/sqlstoretest",
		faults: "listen,impostor", sql: "postgres",
	},
	// What the adapters over the lifecycle promise: Do's results, gRPC's
	// answers, the client's retries.
	{
		name: "do-compares-pointer-encoders-by-fields", file: "codec.go",
		from:   "for _, t := range []reflect.Type{t, reflect.PointerTo(t)} {",
		to:     "for _, t := range []reflect.Type{t} {",
		breaks: "a duplicate of Do gets a result changed on the way, with a nil error: a value encoded by its pointer's MarshalJSON, in a map, comes back zero",
		tests:  "TestDoResultsRoundTripOrAreRefused",
		unseen: "the fault checker's results are plain structs that encoding/json carries whole",
	},
	{
		name: "grpc-unstorable-answer-releases", file: "grpcidem/answer.go",
		from:   "return unstorable(fmt.Errorf(\"grpcidem: the response does not marshal: %w\", err)), nil",
		to:     "return nil, err",
		breaks: "a gRPC method that ran and returned a response that does not marshal runs again for every retry of its key",
		tests:  "TestAResponseThatDoesNotMarshalIsNotReplayable", module: "grpcidem",
		unseen: "the fault checker calls HTTP routes and Do, not gRPC methods",
	},
	{
		name: "client-resumes-from-another-answer", file: "client/resume.go",
		from:   "case copied != b.read || !bytes.Equal(again.Sum(nil), want):",
		to:     "case copied != b.read || !bytes.Equal(want, want):",
		breaks: "a client whose answer was cut under its body reads the first answer's bytes joined to another answer's (a layer that encodes each answer anew)",
		tests:  "Resum", pkgs: []string{"./client/"},
		unseen: "the fault checker's clients are its own driver, not client.Transport",
	},
	{
		name: "client-returns-answer-cut-in-headers", file: "client/retry.go",
		from:   "case cutUnderHeaders(err), cutUnderTrailer(err):",
		to:     "case false && cutUnderHeaders(err), false && cutUnderTrailer(err):",
		breaks: "a client whose answer was cut inside its status line, a header or its trailers gets an error after the request ran, and resends it under a new key",
		tests:  "Cut", pkgs: []string{"./client/"},
		unseen: "the fault checker's clients are its own driver, not client.Transport",
	},
	{
		name: "token-record-dies-on-the-instances-clock", file: "keys.go",
		from:   "const clockAllowance = time.Minute",
		to:     "const clockAllowance = time.Second",
		breaks: "a spent token whose record outlives the record TTL is spent again on a store whose clock is seconds behind the instance's",
		tests:  "TestATokensRecordOutlivesItOnALaggingStoreClock",
		unseen: "the checker's instances and store share one machine's clock",
	},
}

// describe is the mutant's line in --list.
func (m mutant) describe() string {
	return strings.Join([]string{m.name, m.file, m.breaks}, "\t")
}
