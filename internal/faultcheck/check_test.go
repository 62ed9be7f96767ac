package faultcheck_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
)

// The promises the check holds the middleware to, each a rule a history can
// break. Counting is done on effects in the application's database, never
// on answers: an answer can be lost, an effect cannot hide.
const (
	ruleTwoEffects          = "two executions of one key reached the effect"
	ruleRanAfterStored      = "a key ran again after its answer was stored"
	ruleReleasedAfterEffect = "a key was released after its execution took effect"
	ruleForeignAnswer       = "a caller got the answer of a key it did not use"
	ruleOtherRequest        = "a request got the first answer of another request"
	ruleAnswerWithoutEffect = "a 2xx answer names an execution whose effect was not applied"
	ruleReplayDiffers       = "a replay differs from the stored answer"
	ruleLeftRunning         = "a key stays running after every lease ran out"
	ruleFinalState          = "a key ends neither stored, released nor interrupted"
	ruleEmpty200            = "an empty 200"
	ruleUndocumented        = "an answer that is neither the handler's nor a documented problem"
	ruleUncaused            = "a documented problem that nothing in the history can cause"
	ruleLostLeaseCancel     = "a lost lease cancelled a handler that no other executor could take over from"
	ruleSpuriousKeyReused   = "a request refused as key-reused while no other request owned the key"
	ruleReleaseLeftClaimed  = "a released key stays claimed after a brief outage"
	ruleHung                = "a request hung"
	ruleUnfinished          = "a request still ran inside an instance long after the history"
	ruleUnprotected         = "a handler ran without an execution"
	ruleOtherBody           = "a request got the stored answer of a request with another body"
	ruleWaitedPastAnswer    = "a duplicate was answered in progress long after the key's answer was stored"
	ruleSharedFence         = "two executions of one key ran under one fencing token"
	ruleSlowWakeups         = "duplicates waiting on another instance replayed long after the key's answer (the run's median)"
	ruleSlowReplays         = "duplicates sent after the key's answer to another instance were slow to replay it (the run's median)"
	ruleReplayedRelease     = "a request got a replay of an execution that gave its key up"
	ruleTakenFromLive       = "a key was taken over from a live executor that its store could reach"
	ruleLeaseLostLive       = "a live executor that its store could reach lost its lease"
)

// checkedRules are the rules TestFaultCheck holds every history to, in the
// order of its report.
var checkedRules = []string{
	ruleTwoEffects, ruleRanAfterStored, ruleReleasedAfterEffect, ruleForeignAnswer, ruleOtherRequest, ruleOtherBody,
	ruleAnswerWithoutEffect, ruleReplayDiffers, ruleReplayedRelease, ruleLeftRunning, ruleFinalState, ruleEmpty200, ruleUndocumented,
	ruleUncaused, ruleWaitedPastAnswer, ruleSlowWakeups, ruleSlowReplays, ruleLostLeaseCancel, ruleSpuriousKeyReused, ruleReleaseLeftClaimed, ruleHung,
	ruleUnfinished, ruleUnprotected, ruleSharedFence, ruleTakenFromLive, ruleLeaseLostLive, ruleAnswerLost,
	ruleDrainLost, ruleDrainRanAgain, ruleDrainInterrupted, ruleDrainNoExit,
	ruleRefusedRan, ruleCrowdWaiter, ruleCrowdFresh,
	ruleRefusedTokenRan, ruleSpentTokenRefused, ruleRevokedTokenSpent,
}

// A violation is one broken rule in one history.
type violation struct {
	rule   string
	key    *keyPlan // nil when no one key's
	detail string
}

// check holds a settled history to every rule.
func check(h *history) []violation {
	var found []violation
	h.arm(ruleUnfinished)
	if !h.drained {
		found = append(found, violation{ruleUnfinished, nil,
			fmt.Sprintf("requests of the history were still inside an instance %v after the last answer", drainBound)})
	}
	found = append(found, checkDrainExits(h)...)
	for _, k := range h.plan.keys {
		found = append(found, newKeyCase(h, k).check()...)
	}
	for name, st := range h.stray {
		h.arm(ruleLeftRunning)
		if st.State == "run" && !lockLapsed(&st) {
			found = append(found, violation{ruleLeftRunning, nil,
				fmt.Sprintf("record %s, whose claim never reached a handler, is held by lock %q for %v more", name, st.Lock, st.LockTTL)})
		}
	}
	return found
}

// keyCase is everything known about one key once its history settled.
type keyCase struct {
	h         *history
	k         *keyPlan
	cfg       historyConfig
	exchanges []*exchange
	state     *admin.KeyState  // nil when no execution started
	starts    map[string]trace // by execution
	applied   map[string]trace // effects applied, by execution
	cancelled map[string]trace
	attempts  []trace // effects applied or fenced out, in order
	last      *trace  // the start with the highest fencing token
	found     []violation
}

func newKeyCase(h *history, k *keyPlan) *keyCase {
	c := &keyCase{h: h, k: k, cfg: h.plan.cfg, state: h.states[k],
		starts: map[string]trace{}, applied: map[string]trace{}, cancelled: map[string]trace{}}
	for _, x := range h.exchanges {
		if x.req.key == k {
			c.exchanges = append(c.exchanges, x)
		}
	}
	for _, tr := range h.traces[k] {
		switch tr.Kind {
		case traceStart:
			c.starts[tr.Exec] = tr
			if c.last == nil || tr.Fence > c.last.Fence {
				c.last = &tr
			}
		case traceEffect:
			c.applied[tr.Exec] = tr
			c.attempts = append(c.attempts, tr)
		case traceFencedOut:
			c.attempts = append(c.attempts, tr)
		case traceCancelled:
			c.cancelled[tr.Exec] = tr
		}
	}
	return c
}

func (c *keyCase) fail(rule, format string, args ...any) {
	c.found = append(c.found, violation{rule, c.k, fmt.Sprintf(format, args...)})
}

func (c *keyCase) check() []violation {
	c.checkExecutions()
	c.checkAnswers()
	c.checkFinalState()
	c.checkCancellations()
	c.checkKeyReused()
	c.checkReleases()
	c.checkWaits()
	c.checkHeldState()
	return c.found
}

// checkHeldState holds the key to the promises about what a process or
// Redis holds: each in the file of its fault.
func (c *keyCase) checkHeldState() {
	c.checkStored()
	c.checkDrains()
	c.checkTokens()
	c.checkLate()
	c.checkBurst()
	c.checkCrowd()
	c.checkRevoked()
}

// describe names an execution by what started it.
func (c *keyCase) describe(exec string) string {
	s, ok := c.starts[exec]
	if !ok {
		return exec + " (never started for this key)"
	}
	return fmt.Sprintf("%s (%s, act %s, on %s)", exec, s.Request, s.Act, s.Instance)
}

// checkExecutions: at most one execution reaches the effect. With
// WithRetryAbandoned an execution whose lease ran out before it stored
// its answer is taken over and runs again, by design; there the fence
// keeps a stale executor from writing after a newer one, and no execution
// may start once an answer is stored.
func (c *keyCase) checkExecutions() {
	for exec, s := range c.starts {
		c.h.arm(ruleUnprotected)
		if s.Fence == 0 || s.Record == "" {
			c.fail(ruleUnprotected, "execution %s ran with no fencing token or record", c.describe(exec))
		}
	}
	if !c.cfg.RetryAbandoned && len(c.attempts) > 0 && len(c.exchanges) > 1 {
		c.h.arm(ruleTwoEffects)
	}
	c.checkFences()
	c.checkTakeovers()
	if !c.cfg.RetryAbandoned && len(c.attempts) > 1 {
		byClaim := slices.Clone(c.attempts)
		slices.SortFunc(byClaim, func(a, b trace) int { return cmp.Compare(c.starts[a.Exec].Fence, c.starts[b.Exec].Fence) })
		if n, all := c.forgottenRuns(byClaim); all {
			for range n {
				c.h.note(noteRanAgain)
			}
		} else {
			var execs []string
			for _, a := range c.attempts {
				execs = append(execs, c.describe(a.Exec))
			}
			c.fail(ruleTwoEffects, "%d executions reached the effect: %s", len(c.attempts), strings.Join(execs, "; "))
		}
	}
	if c.stored() {
		c.h.arm(ruleRanAfterStored)
		// A takeover that did nothing and was undone hands the key back to
		// the executor it was taken from, whose answer may be stored after
		// it (from the background, once Redis answers): what must never
		// happen is an effect after the stored answer's execution.
		for exec, s := range c.starts {
			// A restart may have lost the record of a later execution's
			// answer, and an earlier one's store then written its own back.
			if s.Fence > c.state.Fence && c.hasApplied(exec) && !c.forgotten(s.Fence) {
				c.fail(ruleRanAfterStored, "execution %s started under token %d, after the answer of token %d was stored",
					c.describe(exec), s.Fence, c.state.Fence)
			}
		}
	}
}

// checkFences: every execution of a key gets a fencing token of its own,
// above those of the executions before it, or storage could not tell a
// stale executor's write from the current one's.
func (c *keyCase) checkFences() {
	if len(c.starts) < 2 {
		return
	}
	c.h.arm(ruleSharedFence)
	by := map[uint64]string{}
	for exec, s := range c.starts {
		if other, ok := by[s.Fence]; ok && other != exec {
			c.fail(ruleSharedFence, "%s and %s both ran under token %d", c.describe(other), c.describe(exec), s.Fence)
		}
		by[s.Fence] = exec
	}
}

// checkTakeovers: under WithRetryAbandoned a key is taken over only from
// an executor whose lease ran out, which a live one renews while Redis
// answers it: a takeover from an executor that was still running, within
// its execution timeout, with nothing between its instance and Redis since
// it started, took over a run that never lapsed.
func (c *keyCase) checkTakeovers() {
	if !c.cfg.RetryAbandoned {
		return
	}
	for _, a := range c.starts {
		answered, ok := c.ownAnswer(a.Exec)
		began := time.Unix(0, a.At)
		// The window in which a's lease, renewed, still held: from one
		// lease after it began (a lapse could have come by then) until a
		// little before its answer, and within its execution timeout.
		from, to := began.Add(c.cfg.Lease), minTime(answered, began.Add(c.cfg.ExecTimeout)).Add(-c.cfg.Lease/2)
		if !ok || !to.After(from) || c.h.disturbed(instanceIndex(a.Instance), began.Add(-c.cfg.Lease), answered) {
			continue
		}
		if slices.ContainsFunc(c.exchanges, func(x *exchange) bool { return x.sent.After(from) && x.sent.Before(to) }) {
			c.h.arm(ruleTakenFromLive)
		}
		for _, b := range c.starts {
			if claimed := claimTime(b.Fence); b.Fence > a.Fence && claimed.After(began) && claimed.Before(to) {
				c.fail(ruleTakenFromLive, "%s took the key over %v after %s started, which answered %v later",
					c.describe(b.Exec), claimed.Sub(began).Round(time.Millisecond), c.describe(a.Exec),
					answered.Sub(claimed).Round(time.Millisecond))
			}
		}
	}
}

// ownAnswer is when the client of exec's request got exec's own answer.
func (c *keyCase) ownAnswer(exec string) (time.Time, bool) {
	for _, x := range c.exchanges {
		if a := read(x).answer; a != nil && a.Exec == exec && !x.replayed() {
			return x.done, true
		}
	}
	return time.Time{}, false
}

// checkAnswers reads every answer the key's callers got.
func (c *keyCase) checkAnswers() {
	bodies := map[string][]byte{} // by execution
	for _, x := range c.exchanges {
		rd := read(x)
		c.h.arm(ruleHung)
		c.h.arm(ruleEmpty200)
		c.h.arm(ruleUndocumented)
		if rd.wrong != "" {
			c.fail(rd.rule, "%s got %s", x.req.name, rd.wrong)
		}
		if rd.problem != "" {
			c.h.arm(ruleUncaused)
			if why := c.uncaused(x, rd.problem); why != "" {
				c.fail(ruleUncaused, "%s on %s got %d %s, but %s", x.req.name, x.instance, x.status, rd.problem, why)
			}
		}
		if rd.answer == nil {
			continue
		}
		a := rd.answer
		if c.shared() {
			c.h.arm(ruleForeignAnswer)
		}
		if a.Scope != c.k.scope || a.Key != c.k.value() {
			c.fail(ruleForeignAnswer, "%s (caller %s, key %s) got the answer of caller %s, key %s",
				x.req.name, c.k.scope, c.k.value(), a.Scope, a.Key)
			continue
		}
		if !x.replayed() {
			c.h.arm(ruleOtherRequest)
			if s, ok := c.starts[a.Exec]; !ok || s.Request != x.req.name {
				c.fail(ruleOtherRequest, "%s got, not marked as a replay, the answer of execution %s", x.req.name, c.describe(a.Exec))
			}
		} else if s, ok := c.starts[a.Exec]; ok {
			c.h.arm(ruleOtherBody)
			if q := c.request(s.Request); q != nil && q.impostor != x.req.impostor {
				c.fail(ruleOtherBody, "%s got a replay of execution %s, which ran the other body", x.req.name, c.describe(a.Exec))
			}
			c.h.arm(ruleReplayedRelease)
			if releasing(s.Act, c.cfg) {
				c.fail(ruleReplayedRelease, "%s got a replay of execution %s, which gave the key up for a retry to run",
					x.req.name, c.describe(a.Exec))
			}
		}
		if x.status/100 == 2 {
			c.h.arm(ruleAnswerWithoutEffect)
			if _, ok := c.applied[a.Exec]; !ok {
				c.fail(ruleAnswerWithoutEffect, "%s got %d from execution %s, whose effect is not in the database",
					x.req.name, x.status, c.describe(a.Exec))
			}
		}
		if x.replayed() {
			c.h.arm(ruleReplayDiffers)
		}
		if x.replayed() && (c.state == nil || c.state.State != "done" || c.state.Fence != a.Fence) {
			if c.forgotten(a.Fence) {
				c.h.note(noteForgottenReply)
			} else {
				c.fail(ruleReplayDiffers, "%s got a replay of execution %s (token %d), but the key holds %s",
					x.req.name, c.describe(a.Exec), a.Fence, stateText(c.state))
			}
		}
		if first, ok := bodies[a.Exec]; ok && !bytes.Equal(first, x.body) {
			c.fail(ruleReplayDiffers, "%s got %q from execution %s, another caller got %q", x.req.name, x.body, a.Exec, first)
		}
		bodies[a.Exec] = x.body
	}
}

// checkFinalState: every key ends stored (an answer, or executed and not
// replayable), released with no effect, or interrupted; never running once
// every lease has run out.
func (c *keyCase) checkFinalState() {
	if c.state == nil {
		return
	}
	c.h.arm(ruleFinalState)
	c.h.arm(ruleLeftRunning)
	if len(c.applied) > 0 {
		c.h.arm(ruleReleasedAfterEffect)
	}
	switch c.state.State {
	case "done":
	case "big":
		if !c.panickedAfterStatus() {
			c.fail(ruleFinalState, "the key ends %s, though every answer of it was small", stateText(c.state))
		}
	case "run":
		if !lockLapsed(c.state) {
			c.fail(ruleLeftRunning, "the key is running under lock %q for %v more, long after every request of it ended",
				c.state.Lock, c.state.LockTTL)
		}
	case "none":
		switch {
		case len(c.applied) > 0 && c.allForgotten():
			c.h.note(noteForgottenEnd)
		case len(c.applied) > 0:
			// Also under WithRetryAbandoned: no execution that took effect
			// releases its key, and undoing a takeover hands the key back
			// to the executor it was taken from (release.lua), so nothing
			// but a Redis restart can free a key that took effect.
			var execs []string
			for exec := range c.applied {
				execs = append(execs, c.describe(exec))
			}
			slices.Sort(execs)
			c.fail(ruleReleasedAfterEffect, "the key is free for a retry to run again, after the effect of %s", strings.Join(execs, "; "))
		}
	default:
		c.fail(ruleFinalState, "the key ends %s", stateText(c.state))
	}
}

// takeoverUndone reports whether, under WithRetryAbandoned, a claim that
// took the key over after its latest execution may have been undone: its
// reply lost, the undo deletes the record, and the key is free without
// that execution having released it. Such a claim never reaches a handler,
// so it shows only as a request of the key, sent after that execution
// started, that got no clean answer.
func (c *keyCase) takeoverUndone() bool {
	started := time.Unix(0, c.last.At)
	return slices.ContainsFunc(c.exchanges, func(x *exchange) bool {
		return x.sent.After(started) && (x.err != nil || read(x).problem == "store-unavailable")
	})
}

// stored reports whether the key ends with its execution's outcome
// stored: an answer, or executed and not replayable.
func (c *keyCase) stored() bool {
	return c.state != nil && (c.state.State == "done" || c.state.State == "big")
}

func (c *keyCase) hasApplied(exec string) bool {
	_, ok := c.applied[exec]
	return ok
}

// checkCancellations: without WithRetryAbandoned nobody can take a key
// over from an executor whose lease ran out, so its handler must run on.
// With it, a lease is lost only when its renewals cannot reach Redis: an
// execution cut off with ErrLockLost while nothing came between its
// instance and Redis, from a lease before it started until the cut, lost a
// lease that was never at risk (its lock was gone, or never taken).
func (c *keyCase) checkCancellations() {
	if c.cfg.RetryAbandoned {
		c.checkLeasesOfLiveExecutors()
		return
	}
	if len(c.starts) > 0 && c.h.stalled() {
		c.h.arm(ruleLostLeaseCancel)
	}
	for exec, tr := range c.cancelled {
		if tr.Cause == causeLockLost {
			c.fail(ruleLostLeaseCancel, "execution %s was cancelled with ErrLockLost", c.describe(exec))
		}
	}
}

// checkLeasesOfLiveExecutors holds every execution that ran past its
// first renewal (a third of a lease) with nothing between its instance and
// Redis to its lease: the watchdog renewed it, so no ErrLockLost cut it.
func (c *keyCase) checkLeasesOfLiveExecutors() {
	for exec, s := range c.starts {
		began := time.Unix(0, s.At)
		end, ok := c.ownAnswer(exec)
		tr, cut := c.cancelled[exec]
		if cut {
			end, ok = time.Unix(0, tr.At), true
		}
		if !ok || end.Sub(began) < c.cfg.Lease/3 ||
			c.h.disturbed(instanceIndex(s.Instance), began.Add(-c.cfg.Lease), end) {
			continue
		}
		c.h.arm(ruleLeaseLostLive)
		if cut && tr.Cause == causeLockLost {
			c.fail(ruleLeaseLostLive, "execution %s was cut off with ErrLockLost %v after it started, with nothing "+
				"between its instance and its store", c.describe(exec), end.Sub(began).Round(time.Millisecond))
		}
	}
}

// checkKeyReused: a request is refused as key-reused only when a request
// with the key and the other body (the key's own, or an impostor's) owns
// it. A request whose execution started owned it, whatever it was answered
// in the end (a handler that panics before its status releases the key,
// and the Transport's resend may then be refused by the other body's
// claim). Of the others, one that was itself refused key-reused never owned
// it; any other may have (even one refused a connection in the end: the
// Transport may have resent it after the instance that ran it died).
func (c *keyCase) checkKeyReused() {
	started := map[string]bool{}
	for _, s := range c.starts {
		started[s.Request] = true
	}
	for _, x := range c.exchanges {
		if read(x).problem != "key-reused" {
			continue
		}
		c.h.arm(ruleSpuriousKeyReused)
		owner := slices.ContainsFunc(c.exchanges, func(y *exchange) bool {
			return y.req.impostor != x.req.impostor && (started[y.req.name] || read(y).problem != "key-reused")
		})
		if !owner {
			c.fail(ruleSpuriousKeyReused, "%s was refused key-reused, but no request with the other body ever owned the key", x.req.name)
		}
	}
}

// waitSlack is how much later than the key's answer a waiting duplicate
// may still be told in progress: a wake-up comes within a round trip of
// the store, and a busy machine may delay it.
const waitSlack = 500 * time.Millisecond

// checkWaits: a duplicate is answered in progress only while the key runs.
// Once the key's first caller has its answer, the answer is stored, and a
// duplicate waiting then is woken and replays it: one that is still told
// in progress well after, with Redis in its instance's reach, waited past
// the answer. Unless the answering instance lost its way to Redis around
// its answer: then its store waits in its background queue (later.go), and
// the key runs until it lands.
func (c *keyCase) checkWaits() {
	if !c.stored() {
		return
	}
	var first *exchange
	for _, y := range c.exchanges {
		if a := read(y).answer; a != nil && !y.replayed() && a.Fence == c.state.Fence && (first == nil || y.done.Before(first.done)) {
			first = y
		}
	}
	if first == nil || c.h.restartAfter(c.state.Fence) {
		return
	}
	for _, x := range c.exchanges {
		c.wokeAfter(x, first)
		if read(x).problem != "in-progress" {
			continue
		}
		c.h.arm(ruleWaitedPastAnswer)
		if x.done.Sub(first.done) > waitSlack && !c.h.disturbed(instanceIndex(x.instance), first.done.Add(-time.Second), x.done) &&
			!c.h.disturbed(instanceIndex(first.instance), first.done.Add(-time.Second), x.done) {
			c.fail(ruleWaitedPastAnswer, "%s on %s was told in progress %v after %s got the key's answer",
				x.req.name, x.instance, x.done.Sub(first.done).Round(time.Millisecond), first.req.name)
		}
	}
}

// wokeAfter records how long after the key's first answer x, a duplicate
// on the other instance already sent then, got its replay, Redis in reach:
// a waiter is woken by the answer's message, within a round trip. One late
// wake-up may be a busy machine; the run's median is judged
// (ruleSlowWakeups), against what a duplicate sent after the answer took
// to replay it, as x would have once woken. A crowd's hundreds of
// duplicates are left out: woken at once, they queue for the instance's
// few connections to read the answer, which says nothing of whether they
// were woken (its own rule holds them to the key's one answer), and they
// would be most of a short run's waking duplicates. On SQL a waiter is
// woken only with LISTEN/NOTIFY (cfg.Listen); without it, it polls, as the
// store promises, and its lag says nothing of a wake-up.
func (c *keyCase) wokeAfter(x, first *exchange) {
	a := read(x).answer
	if a == nil || !x.replayed() || a.Fence != c.state.Fence || x.instance == first.instance ||
		c.k.role == roleCrowd || c.h.disturbed(instanceIndex(x.instance), x.sent, x.done) {
		return
	}
	if !x.sent.Before(first.done) {
		c.h.arm(ruleSlowReplays)
		c.h.replays = append(c.h.replays, x.done.Sub(x.sent))
		return
	}
	if c.h.plan.onSQL && !c.cfg.Listen {
		return
	}
	c.h.arm(ruleSlowWakeups)
	c.h.lags = append(c.h.lags, max(x.done.Sub(first.done), 0))
}

// slowWakeup is the median lag of a run's waking duplicates past which
// they were not woken: a message wakes a waiter within a round trip (a
// median of 0 to 1 ms on a busy machine), while without one it polls, at
// pauses that double up to 500 ms (a median of 60 ms).
const slowWakeup = 30 * time.Millisecond

// releasing reports whether an act gives its key up without any effect.
func releasing(act string, cfg historyConfig) bool {
	switch act {
	case actRelease, actPanicBefore, actFnError:
		return true
	case actTransient:
		return cfg.NoTransient
	}
	return false
}

// checkReleases: an execution that gives its key up (Release, a releasing
// policy, a panic before any answer, Do's function failing) frees it
// through a brief Redis outage: no retry may find it interrupted.
//
// Brief is judged twice. The faults injected around the execution add up
// to a brief outage at most (an instance killed is no outage); and the
// release itself, from the moment the handler gave the key up to its
// answer, took no longer than a brief outage and one store timeout, so
// that a release slowed by something the timeline does not show (a
// starved process on a busy machine) is not taken for one that gave up
// too soon.
func (c *keyCase) checkReleases() {
	x := c.last
	if x == nil || !releasing(x.Act, c.cfg) || c.hasApplied(x.Exec) {
		return
	}
	if _, ok := c.cancelled[x.Exec]; ok {
		return
	}
	gaveUp := time.Unix(0, x.At).Add(c.pauseOf(x.Request))
	answered, ok := c.answeredAfter(x)
	if !ok || answered.Sub(gaveUp) > c.cfg.briefOutage()+c.cfg.StoreTimeout {
		return
	}
	out, killed := c.h.outage(instanceIndex(x.Instance), time.Unix(0, x.At).Add(-c.cfg.Lease), answered.Add(c.cfg.Lease))
	if killed || out > c.cfg.briefOutage() {
		return
	}
	c.h.arm(ruleReleaseLeftClaimed)
	if c.state == nil || !lockLapsed(c.state) || c.last.Fence != c.state.Fence {
		return // not claimed, or claimed last by a claim that never reached a handler
	}
	c.fail(ruleReleaseLeftClaimed, "execution %s gave the key up, yet it stays claimed (a retry gets 409 interrupted); "+
		"its store was out of reach for %v around it, and the release took %v", c.describe(x.Exec), out.Round(time.Millisecond),
		answered.Sub(gaveUp).Round(time.Millisecond))
}

// pauseOf is the pause of the request named name before its handler gave
// its key up.
func (c *keyCase) pauseOf(name string) time.Duration {
	for _, y := range c.exchanges {
		if y.req.name == name {
			return y.req.pause
		}
	}
	return 0
}

// answeredAfter is when the client of execution x heard back, which is
// after the release: net/http completes an answer, or closes the
// connection of a handler that panicked, once the handler and the
// middleware have returned. ok is false when the client left first.
func (c *keyCase) answeredAfter(x *trace) (at time.Time, ok bool) {
	for _, y := range c.exchanges {
		gone := errors.Is(y.err, context.Canceled) || errors.Is(y.err, context.DeadlineExceeded)
		if y.req.name == x.Request && !gone && y.done.After(time.Unix(0, x.At)) {
			return y.done, true
		}
	}
	return time.Time{}, false
}

func instanceIndex(name string) int {
	if name == "b" {
		return 1
	}
	return 0
}

// outage is how long Redis was out of reach for instance i within
// [from, to] (stopped, blackholed or slowed: overlapping faults count
// once), and whether the instance was killed then.
func (h *history) outage(i int, from, to time.Time) (out time.Duration, killed bool) {
	return outage(h.faults, i, from, to)
}

func outage(faults []faultEvent, i int, from, to time.Time) (out time.Duration, killed bool) {
	type span struct{ from, to time.Time }
	var spans []span
	for _, f := range faults {
		if f.instance != -1 && f.instance != i {
			continue
		}
		switch f.kind {
		case kindKill, kindDrain:
			killed = killed || !f.to.Before(from) && !f.from.After(to)
		case kindRedisStop, kindBlackhole, kindDelay, kindRedisRestart, kindSaturate, kindDBStall, kindDBRestart:
			s := span{maxTime(f.from, from), minTime(f.to, to)}
			if s.to.After(s.from) {
				spans = append(spans, s)
			}
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	var reach time.Time // the end of what is counted so far
	for _, s := range spans {
		if s.from.Before(reach) {
			s.from = reach
		}
		if s.to.After(s.from) {
			out += s.to.Sub(s.from)
			reach = s.to
		}
	}
	return out, killed
}

// lockLapsed reports whether st is claimed and nobody holds its lock under
// the claim's value: its run ended without an answer, or stalled past its
// lease. The checker judges by that; KeyState.Interrupted also asks that
// the claim horizon has passed, by the operator's settings, which are not
// the history's.
func lockLapsed(st *admin.KeyState) bool { return st.State == "run" && st.Lock != st.Owner }

func stateText(st *admin.KeyState) string {
	if st == nil {
		return "no record"
	}
	s := st.State
	if lockLapsed(st) {
		s += " (lock lapsed)"
	}
	if st.Lock != "" {
		s += fmt.Sprintf(", lock held %v more", st.LockTTL)
	}
	return fmt.Sprintf("%s, token %d, %d executions", s, st.Fence, st.Executions)
}

// reading is what one answer says by itself.
type reading struct {
	label   string      // its class, for the tally
	answer  *answerBody // the handler's answer, first or replayed, when it is one
	problem string      // a problem's slug
	rule    string      // the rule the answer breaks by itself
	wrong   string      // and how
}

// documented is the problem table of the README: slug and status.
var documented = map[string]int{
	"missing-key": 400, "invalid-key": 400, "unreadable-body": 400, "request-too-large": 413,
	"no-scope": 401, "token-not-found": 422, "key-reused": 422, "in-progress": 409,
	"not-replayable": 409, "interrupted": 409, "unreadable-record": 409, "store-unavailable": 503,
}

// uncaused says why nothing in the key's history can cause the problem
// slug that x got, or "" when something can. Each problem is a promise
// about what the client was told:
//
//   - key-reused: another request with the key owns it (checkKeyReused).
//   - in-progress: "another request with this key is running": some other
//     request of the key was sent before x ended, or an earlier try of x
//     itself (net/http resends) started; and x did not wait long past an
//     answer the key already had (checkWaits).
//   - interrupted: "an execution was claimed and can no longer store": a
//     claim of the key that was never answered and stored, or, for one
//     that was, met past its claim horizon, when a store may land late.
//   - store-unavailable: "Redis could not answer, nothing ran": a fault
//     between x's instance and Redis (or of Redis) around x.
//   - not-replayable: a panic after the status cut an answer short.
//   - token-not-found: "this token is not one this caller may spend": only
//     a revocation of the key that signed it, before the request, can make
//     a token the rig issued unknown; a Redis restart cannot (the key ring
//     is configuration).
//
// Every request of a history is well formed and every answer small, so no
// other problem has a cause.
func (c *keyCase) uncaused(x *exchange, slug string) string {
	switch slug {
	case "key-reused":
		return ""
	case "in-progress":
		switch {
		case !c.othersBefore(x):
			return "no other request of the key was sent before it ended, and none of its own tries ran"
		case c.quietBefore(x):
			return "every other request of the key had its answer before it was sent, and nothing came between the instances and their store"
		}
		return ""
	case "interrupted":
		return c.uncausedInterrupted(x)
	case "store-unavailable":
		if !c.h.disturbed(instanceIndex(x.instance), x.sent.Add(-c.cfg.Lease-c.cfg.StoreTimeout), x.done) {
			return "nothing came between its instance and its store around it"
		}
		return ""
	case "not-replayable":
		if !c.panickedAfterStatus() {
			return "no handler of the key panicked after its status"
		}
		return ""
	case "token-not-found":
		switch {
		case c.k.route != routeForm:
			return "the key is not a token"
		case c.h.revoked.IsZero() || x.sent.Before(c.h.revoked):
			return "no key was revoked before it, and every instance spends the tokens of the key that signed it"
		}
		return ""
	}
	return "no request of the history can cause it"
}

// othersBefore reports whether a request of the key other than x was sent
// before x ended, or one of x's own earlier tries started.
func (c *keyCase) othersBefore(x *exchange) bool {
	for _, y := range c.exchanges {
		if y != x && y.sent.Before(x.done) {
			return true
		}
	}
	for _, s := range c.starts {
		if s.Request == x.req.name && time.Unix(0, s.At).Before(x.done) {
			return true
		}
	}
	return len(c.h.stray) > 0 // a claim that never reached a handler: whose, the record does not say
}

// quietBefore reports whether, on a plain route (no outer timeout answers
// for a handler that runs on), every other request of the key had its
// answer before x was sent (a whole one, or the end of a handler that
// panicked: a client that gave up leaves its handler running), none of
// x's own tries ran, and no fault of any kind struck the history from the
// key's first request to x's answer: then nothing of the key can still
// run, and a run whose answer could not be stored was kept (keep.lua),
// which reads interrupted, not in progress.
func (c *keyCase) quietBefore(x *exchange) bool {
	if c.k.route != routeKey || len(c.h.stray) > 0 {
		return false
	}
	first := x.sent
	for _, y := range c.exchanges {
		if y == x {
			continue
		}
		panicked := y.req.act == actPanicBefore || y.req.act == actPanicAfter
		if !y.done.Before(x.sent) || y.err != nil && !panicked {
			return false
		}
		first = minTime(first, y.sent)
	}
	for _, s := range c.starts {
		if s.Request == x.req.name {
			return false
		}
	}
	for i := range 2 {
		if c.h.disturbed(i, first.Add(-time.Second), x.done) {
			return false
		}
	}
	return true
}

// uncausedInterrupted: x got interrupted, but the execution it met stored
// its answer, in its own time: its claim was within the claim horizon
// (claimHorizon in options.go) when x was answered.
func (c *keyCase) uncausedInterrupted(x *exchange) string {
	if !c.othersBefore(x) {
		return "no other request of the key was sent before it ended, and none of its own tries ran"
	}
	var met *trace
	for _, s := range c.starts {
		if claimTime(s.Fence).Before(x.done) && (met == nil || s.Fence > met.Fence) {
			met = &s
		}
	}
	if met == nil || !c.stored() || c.state.Fence != met.Fence || c.forgotten(met.Fence) {
		return ""
	}
	horizon := c.cfg.ExecTimeout + c.cfg.Lease + 4*c.cfg.StoreTimeout
	if age := x.done.Sub(claimTime(met.Fence)); age < horizon-time.Second {
		return fmt.Sprintf("the execution it met, %s, claimed %v before, stored its answer within its claim horizon (%v)",
			c.describe(met.Exec), age.Round(time.Millisecond), horizon)
	}
	return ""
}

// disturbed reports whether anything came between instance i and Redis
// within [from, to]: an outage, a lost reply, a crowd at maxclients, the
// instance killed or drained, Redis restarted or the queue saturated.
func (h *history) disturbed(i int, from, to time.Time) bool {
	for _, f := range h.faults {
		if f.instance != -1 && f.instance != i || f.to.Before(from) || f.from.After(to) {
			continue
		}
		switch f.kind {
		case kindRedisStop, kindBlackhole, kindDelay, kindDropReply, kindRedisRestart, kindSaturate, kindCrowd,
			kindKill, kindDrain, kindStarved, kindDBStall, kindDBRestart:
			return true
		}
	}
	return false
}

// stalled reports whether Redis stalled or went out of reach during the
// history: what can let a lease run out under a live handler.
func (h *history) stalled() bool {
	return slices.ContainsFunc(h.faults, func(f faultEvent) bool {
		switch f.kind {
		case kindRedisStop, kindBlackhole, kindDelay, kindRedisRestart, kindDBStall, kindDBRestart:
			return true
		}
		return false
	})
}

// shared reports whether another caller of the history sends the key's id:
// the one case where a caller could get an answer that is not its own.
func (c *keyCase) shared() bool {
	return slices.ContainsFunc(c.h.plan.keys, func(k *keyPlan) bool { return k != c.k && k.id == c.k.id && k.scope != c.k.scope })
}

// request is the key's request named name, or nil.
func (c *keyCase) request(name string) *requestPlan {
	for _, x := range c.exchanges {
		if x.req.name == name {
			return x.req
		}
	}
	return nil
}

func (c *keyCase) panickedAfterStatus() bool {
	for _, s := range c.starts {
		if s.Act == actPanicAfter {
			return true
		}
	}
	return false
}

// read classifies an answer.
func read(x *exchange) reading {
	if x.err != nil {
		return readFailure(x)
	}
	replay := ""
	if x.replayed() {
		replay = " replayed"
	}
	ct := x.header.Get("Content-Type")
	switch {
	case x.status == http.StatusOK && len(x.body) == 0:
		return reading{label: "empty 200", rule: ruleEmpty200,
			wrong: fmt.Sprintf("200 with an empty body (headers %v)", x.header)}
	case strings.HasPrefix(ct, "application/problem+json"):
		return readProblem(x)
	case x.req.key.route == routeOuterTimeout && x.status == http.StatusServiceUnavailable && string(x.body) == outerTimeoutMessage:
		return reading{label: "503 of the outer timeout handler"}
	}
	var a answerBody
	if err := json.Unmarshal(x.body, &a); err != nil || a.Exec == "" {
		return reading{label: fmt.Sprintf("undocumented %d", x.status), rule: ruleUndocumented,
			wrong: fmt.Sprintf("%d %q", x.status, x.body)}
	}
	if what := x.header.Get(deliberateHeader); what != "" {
		return reading{label: fmt.Sprintf("%d the handler's own %s%s", x.status, what, replay), answer: &a}
	}
	if x.status != http.StatusCreated {
		return reading{label: fmt.Sprintf("undocumented %d", x.status), rule: ruleUndocumented,
			wrong: fmt.Sprintf("%d %q", x.status, x.body)}
	}
	return reading{label: "201" + replay, answer: &a}
}

func readFailure(x *exchange) reading {
	took := x.done.Sub(x.sent)
	switch {
	case took >= clientBound-time.Second && x.req.act == actPanicBefore && !errors.Is(x.err, context.DeadlineExceeded):
		// The handler panics at every run, before anything took effect, so
		// each run gives the key back, and net/http's Transport resends the
		// request on each reused connection that a panic closed (send):
		// the client's own loop, which ends when it takes a new one.
		return reading{label: "none: connection lost at each of the Transport's resends"}
	case took >= clientBound-time.Second:
		return reading{label: "hung", rule: ruleHung, wrong: fmt.Sprintf("no answer within %v", took.Round(time.Millisecond))}
	case x.req.disconnectAfter > 0 && errors.Is(x.err, context.Canceled):
		return reading{label: "none: the client disconnected"}
	case x.req.deadline > 0 && errors.Is(x.err, context.DeadlineExceeded):
		return reading{label: "none: the client's deadline passed"}
	case errors.Is(x.err, syscall.ECONNREFUSED):
		return reading{label: "none: connection refused (instance down)"}
	case x.status != 0:
		return reading{label: fmt.Sprintf("%d cut off mid-body", x.status)}
	}
	return reading{label: "none: connection lost"}
}

func readProblem(x *exchange) reading {
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	bad := func(why string) reading {
		return reading{label: "undocumented problem", rule: ruleUndocumented, wrong: fmt.Sprintf("%d %q: %s", x.status, x.body, why)}
	}
	if err := json.Unmarshal(x.body, &p); err != nil {
		return bad(err.Error())
	}
	slug, ok := strings.CutPrefix(p.Type, idempotency.ProblemTypeBase)
	status, known := documented[slug]
	switch {
	case !ok || !known:
		return bad("not a documented problem type")
	case status != x.status || p.Status != x.status:
		return bad(fmt.Sprintf("the README documents %s as %d", slug, status))
	case (slug == "in-progress" || slug == "store-unavailable") && x.header.Get("Retry-After") == "":
		return bad("no Retry-After")
	}
	return reading{label: "problem " + slug, problem: slug}
}
