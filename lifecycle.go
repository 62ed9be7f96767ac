package idempotency

import (
	"context"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"time"
)

// A key's life, from its claim to its end, and the one rule that decides it.
//
// The request (or Do call) whose claim takes a key's lock holds a lease:
// the lock, renewed by a watchdog, and the claim (claim.go). From
// then on the lease owns the key's fate, and every transition is one of its
// methods below; nothing else runs the scripts that store an answer or
// release a claim.
//
//	claim ─→ execute ─→ store     the answer is the key's, replayed to every duplicate
//	  │         ├─────→ release   a retry runs again
//	  │         └─────→ keep      the key reads interrupted (or is taken over)
//	  └─→ release (the claim failed, or its reply was lost: undone in the background)
//
// The release rule: a key is released only when nothing of the run can
// still take effect.
//
//	what happened                                              the key
//	the claim failed, or its reply never came                  released
//	the lease ran out before the work started                  released
//	the handler panicked before its status was sent, and
//	  before any step began                                    released
//	the function panicked (Do), before any step began          released
//	Release(ctx) was called while the work ran                 released
//	the store policy releases the answer, or the function
//	  returned an error (Do without StoreErrors)               released
//	the middleware cut the run off, and it did not succeed     kept
//	the handler panicked after its status was sent, or after
//	  the middleware cut it off                                kept
//	any other answer                                           stored
//
// The middleware cuts a run off (cancels its context) when the execution
// timeout ends it, or when its lease is lost while another executor could
// take the key over (WithRetryAbandoned, WithOutcomeStore). What a cut-off
// run did before it noticed is unknown, and a failure it answers is one to
// the cancellation (as is a silent return, which net/http sends as an
// empty 200), not the key's: it is neither stored nor a reason to release.
// A cut-off run that still succeeded (a 2xx its handler wrote, a function's
// nil error) finished its work, and its answer is stored if the key is
// still its own: running it again is what the promise forbids. Without an
// executor that could take over, a lost lease cuts nothing: the record
// still names the run, and its answer is stored once Redis answers.
//
// A release or a store that Redis does not answer is tried again in the
// background (later.go), so a brief outage neither turns a released key
// into an interrupted one nor loses an answer; Shutdown drains it.

// A lease is one call's hold on a key. It begins when its claim takes the
// key's lock and ends when the lock is let go: by the store of the answer,
// by a release or by keep. Its watchdog renews the lock exactly that long,
// so neither a replica wait nor a slow handler outlives it, while a crashed
// instance frees the key within one lease. The watchdog starts (watch)
// once the claim has claimed, on the schedule it would have had from the
// claim's start: a claim that did not claim (a replay, a refusal) took no
// lock, and costs no timer.
type lease struct {
	m         *Middleware
	k         keys
	lockValue string    // the lock's value, which the scripts check
	wd        *watchdog // nil until watch
	began     time.Time // when the claim that took the lock was sent
	fpText    string    // the claiming request's fingerprint, as the scripts take it
	fence     uint64    // the claim's fencing token, once claimed
	steps     *journal  // a resumable run's journal (WithResume), once claimed
	// committed is the record the handler's own transaction stored
	// (StoreAnswerInTx), once it did.
	committed atomic.Pointer[string]
	// inTxConflicts: storing it there aborted the handler's transaction
	// once; its next attempt leaves the store to complete.
	inTxConflicts atomic.Bool

	// The run's context: cancelled with ErrLockLost or, by its timer, with
	// ErrExecutionTimeout.
	cutRun  context.CancelCauseFunc
	stopRun context.CancelFunc
}

// newLease is the lease a claim sent at began tries to take under a fresh
// lock value.
func (m *Middleware) newLease(k keys, fp string, began time.Time) *lease {
	return &lease{m: m, k: k, lockValue: newLockValue(), fpText: fp, began: began}
}

// watch starts the lease's watchdog, counting from the claim.
func (l *lease) watch() {
	if l.wd == nil {
		// Where nobody else may run the key, a live run takes its lapsed
		// lock back.
		l.wd = startWatchdog(l, l.m.cfg.lease, l.m.cfg.storeTimeout, l.began, !l.m.cfg.takeover())
	}
}

// renew renews the lease's lock (see renewer).
func (l *lease) renew(ctx context.Context, retake bool) (bool, error) {
	return l.m.keyStore.renew(ctx, l.k, l.lockValue, retake)
}

// A runner runs a call's work: a handler (handlerRun) or a function
// (funcRun). The lease runs it and decides what becomes of the key.
type runner interface {
	// run does the work once, on ctx, as the execution x, and returns the
	// answer to store: nil when it cannot be replayed.
	run(ctx context.Context, x *execution) *record
	// decide says what the store policy makes of the answer run returned.
	decide(x *execution) StoreDecision
	// committed reports whether a panic now must keep the key: the
	// handler's status went out, or the function returned.
	committed() bool
	// succeeded reports whether the answer run returned says the work
	// finished: a 2xx the handler wrote, a function's nil error.
	succeeded() bool
	// unprotected does the work without a lease (a method that is not
	// protected, an optional key, fail-open).
	unprotected()
}

// execute runs the call's work once under the lease and settles the key by
// the release rule. A panic goes on to the caller's recoverer, after the
// key was released or kept.
func (l *lease) execute(c *call) verdict {
	ctx, x := l.startRun(c)
	defer l.endRun()
	returned, ruled := false, false
	defer func() {
		if ruled {
			return
		}
		fate, why := releaseRule(runEnd{panicked: true, committed: returned || c.work.committed(),
			cut: cutOff(ctx), tookEffect: x.tookEffect()})
		if fate == fateRelease {
			l.release(c.ctx)
			return
		}
		l.keep(why)
	}()
	rec := c.work.run(ctx, x)
	returned = true
	x.closeRelease() // a Release from now on takes no effect
	v := l.applyReleaseRule(c, x, cutOff(ctx), rec, c.work.decide(x))
	ruled = true
	return v
}

// startRun gives the run its context. Once the key is claimed the run must
// finish: a client that gives up (a double-clicking browser aborts its
// first POST) retries and must find this execution's result, not a
// half-done one; so the caller's cancellation does not reach it. The
// middleware cuts it off only as the release rule says.
func (l *lease) startRun(c *call) (context.Context, *execution) {
	x := &execution{key: l.k.record, fp: c.fp, fence: l.fence, maxResponse: l.m.cfg.maxResponse, lease: l}
	if l.steps != nil {
		x.steps.Store(l.steps)
	}
	var ctx context.Context = &runContext{parent: c.ctx, x: x}
	if l.m.cfg.takeover() {
		// Only a lease that someone else could take over cuts its run off.
		var cut context.CancelCauseFunc
		ctx, cut = context.WithCancelCause(ctx)
		l.cutRun = cut
		l.wd.notify(func() { cut(ErrLockLost) })
	}
	if costing && cost.noExecTimeout {
		l.stopRun = func() {}
	} else {
		ctx, l.stopRun = context.WithTimeoutCause(ctx, l.m.cfg.execTimeout, ErrExecutionTimeout)
	}
	x.run = ctx
	return ctx, x
}

// endRun releases the run's context and its timer.
func (l *lease) endRun() {
	l.stopRun()
	if l.cutRun != nil {
		l.cutRun(nil)
	}
}

// runContext carries the caller's values and the execution, and none of
// the caller's cancellation: what context.WithoutCancel and
// context.WithValue make together, in one allocation instead of two.
type runContext struct {
	parent context.Context
	x      *execution
}

func (*runContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*runContext) Done() <-chan struct{}       { return nil }
func (*runContext) Err() error                  { return nil }

func (c *runContext) Value(key any) any {
	if key == executionKey {
		return c.x
	}
	return c.parent.Value(key)
}

// cutOff is why the middleware cut the run on ctx off, or nil.
func cutOff(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

// applyReleaseRule applies the release rule (releaserule.go) to a run that
// returned.
func (l *lease) applyReleaseRule(c *call, x *execution, cut error, rec *record, d StoreDecision) verdict {
	fate, why := releaseRule(runEnd{cut: cut, released: x.released(), policyReleases: d.Release,
		tookEffect: x.tookEffect(), lostStep: l.steps != nil && l.steps.lostStep(), succeeded: c.work.succeeded()})
	switch fate {
	case fateKeep:
		return l.keep(why)
	case fateStore:
		return l.store(c, rec, d.TTL)
	}
	l.release(c.ctx)
	return verdict{outcome: Executed, released: true, err: cut}
}

// store keeps the run's answer for every duplicate (rec nil: executed, not
// replayable) and ends the lease.
func (l *lease) store(c *call, rec *record, ttl time.Duration) verdict {
	defer l.end()
	expires := time.Now().Add(ttl) // before the store: never overstated
	how, err := l.complete(c.ctx, rec, ttl)
	switch {
	case errors.Is(err, ErrLockLost):
		l.m.cfg.logger.Error("idempotency: lock lost: the handler ran, but another execution owns its key now (it was "+
			"taken over, or an operator settled it); this answer is not the key's and was not stored",
			"key", l.k.record)
		return verdict{outcome: Executed, err: err}
	case err != nil:
		l.m.cfg.logger.Error("idempotency: the handler ran but its answer could not be stored yet; "+
			"trying again in the background", "key", l.k.record, "error", err)
		l.storeLater(rec, ttl)
		return verdict{outcome: Executed, err: err}
	case how == rewritten:
		l.m.cfg.logger.Warn("idempotency: the key's record vanished while its handler ran (record TTL, eviction "+
			"or a flush); the answer was stored again", "key", l.k.record)
	}
	if rec != nil {
		rec.expires = expires
		l.m.cache.put(c.id, c.fp, rec, l.m.cacheExpiry(rec))
	}
	return verdict{outcome: Executed, rec: rec, storedFor: ttl}
}

// complete stores rec, tried again briefly: the work has run, and a lost
// store leaves the key for the background (or, past it, interrupted).
func (l *lease) complete(ctx context.Context, rec *record, ttl time.Duration) (how completion, err error) {
	for attempt, pause := 0, 10*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*2 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		step, cancel := l.m.stepContext(ctx)
		if l.committed.Load() != nil && l.completeCommitted(step, rec, l.k.lifetime(ttl).Microseconds()) {
			cancel()
			return completed, nil
		}
		how, err = l.m.keyStore.complete(step, l.k, &l.lockValue, l.fpText, l.fence, rec, ttl)
		cancel()
		if err == nil || errors.Is(err, ErrLockLost) {
			return how, err
		}
	}
	return how, err
}

// release gives the key up, so that a retry runs again: the record goes,
// an issued token returns to its scope, and the lock is freed. When Redis
// does not answer, the release goes on in the background.
func (l *lease) release(ctx context.Context) {
	l.end()
	step, cancel := l.m.stepContext(ctx)
	err := l.m.keyStore.release(step, l.k, l.lockValue)
	cancel()
	if err != nil {
		l.releaseLater()
	}
}

// releaseLater releases the key in the background: for a claim whose reply
// never came (the client's 503 must not wait for a Redis that just failed
// us), and for a release that Redis did not answer. Left undone, the claim
// would read as interrupted for the record's whole lifetime although
// nothing ran; so it is tried for as long as the process lives, however
// long Redis is away: a release that lands late still frees the key, and
// can never undo an effect (nothing of the run takes effect).
func (l *lease) releaseLater() {
	l.end()
	l.m.later.add(l.k, "release", 0, time.Time{}, func(ctx context.Context) error {
		return l.m.keyStore.release(ctx, l.k, l.lockValue)
	})
}

// laterDeadline is how long the background tries a job of this lease: for
// as long as the key's record lives. Until then what the job writes still
// counts: the record names this run until another executor takes the key
// over (the scripts then write nothing) or an operator settles it. A store
// that lands past the claim horizon turns a key that read interrupted into
// a replayed one; giving it up at the horizon would lose an answer to an
// outage that merely outlasted it, also while Shutdown drains.
func (l *lease) laterDeadline() time.Time {
	return l.began.Add(l.k.lifetime(l.m.cfg.recordTTL))
}

// storeLater stores rec in the background, for a run whose store Redis did
// not answer.
func (l *lease) storeLater(rec *record, ttl time.Duration) {
	size := int64(0)
	if rec != nil {
		size = rec.size()
	}
	l.m.later.add(l.k, "store", size, l.laterDeadline(), func(ctx context.Context) error {
		_, err := l.m.keyStore.complete(ctx, l.k, &l.lockValue, l.fpText, l.fence, rec, ttl)
		if errors.Is(err, ErrLockLost) {
			return nil // another executor owns the key: nothing of ours to store
		}
		return err
	})
}

// keep leaves the key claimed and lets its lock go: the run is over, and
// what it did cannot be known, so the key reads interrupted (409) until an
// operator settles it, or is taken over by the next retry (with
// WithRetryAbandoned or an outcome store).
func (l *lease) keep(why error) verdict {
	l.end()
	ctx, cancel := l.m.stepContext(context.Background())
	if err := l.m.keyStore.keep(ctx, l.k, l.lockValue); err != nil {
		// Unmarked, the key reads in progress until the claim horizon
		// has passed, and interrupted then.
		l.letGo()
	}
	cancel()
	if l.steps != nil {
		l.m.cfg.logger.Info("idempotency: the run ended without an answer to store; its key is kept for the "+
			"next retry to resume", "key", l.k.record, "reason", why)
	} else {
		l.m.cfg.logger.Warn("idempotency: the run ended without an answer to store and may have taken effect; "+
			"its key is kept as interrupted", "key", l.k.record, "reason", why)
	}
	return verdict{outcome: Executed, err: why}
}

// Why a resumable run is kept rather than released or stored.
var (
	errStepsJournaled   = errors.New("idempotency: the run would release its key after journaling steps; a retry resumes it")
	errStepNotJournaled = errors.New("idempotency: a step of the run was not journaled and the run did not succeed")
)

// resumeFrom starts the journal of a resumable run from what its claim
// handed over (handed: the steps of the runs it takes over, or nil). A
// journal that cannot be read cannot be resumed from: as for an answer that
// cannot be decoded, retrying cannot help.
func (l *lease) resumeFrom(handed *string) verdict {
	j, err := newJournal(l, handed)
	if err != nil {
		l.m.cfg.logger.Error("idempotency: an abandoned run's step journal cannot be read", "key", l.k.record, "error", err)
		l.end()
		l.letGo()
		return refuse(ErrUnreadableRecord)
	}
	if len(j.entries) > 0 {
		l.m.cfg.logger.Info("idempotency: resuming an abandoned run", "key", l.k.record, "fence", l.fence,
			"journaled steps", len(j.entries))
	}
	l.steps = j
	return verdict{}
}

// letGo frees the key's lock and leaves its record as it is. When Redis
// does not answer, the lock runs out by itself within a lease.
func (l *lease) letGo() {
	ctx, cancel := l.m.stepContext(context.Background())
	defer cancel()
	l.m.keyStore.unlock(ctx, l.k, l.lockValue)
}

// end stops renewing the lock. Every transition ends the lease; ending it
// twice is harmless.
func (l *lease) end() {
	if l.wd != nil {
		l.wd.stop()
	}
}

// recoverAbandoned settles an abandoned execution that the lease has just
// taken over, from the outcome store (WithOutcomeStore): the answer the
// abandoned executor committed is stored and replayed; when it committed
// nothing, the store has fenced it out and runAgain says so: the work runs
// again under this lease.
func (l *lease) recoverAbandoned(c *call) (runAgain bool, v verdict) {
	m := l.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), m.cfg.execTimeout)
	a, committed, err := m.cfg.outcomes.Recover(ctx, l.k.record, l.fence)
	cancel()
	if err == nil && !committed && l.wd.isLost() {
		err = ErrLockLost // another instance may have taken the key over: it runs, not us
	}
	switch {
	case errors.Is(err, ErrUnreadableRecord):
		// It committed, and what it answered cannot be read: as for a
		// record in Redis that cannot be decoded, retrying cannot help.
		m.cfg.logger.Error("idempotency: an abandoned execution's committed answer cannot be read",
			"key", l.k.record, "error", err)
		l.end()
		l.letGo()
		return false, refuse(ErrUnreadableRecord)
	case err != nil:
		// Whether the abandoned execution committed is still unknown. The
		// key stays claimed under our lock value, so once the lock is gone
		// a retry takes the execution over and asks again.
		m.cfg.logger.Warn("idempotency: could not recover an abandoned execution from the outcome store",
			"key", l.k.record, "error", err)
		l.end()
		l.letGo()
		// Not "store unavailable", whose answer says nothing ran: the
		// abandoned execution may have. In progress, retry later, is true.
		return false, refuse(m.inProgress())
	case !committed:
		m.cfg.logger.Info("idempotency: an abandoned execution committed nothing; running the "+c.workName()+" again",
			"key", l.k.record, "fence", l.fence)
		return true, verdict{}
	case a.Fingerprint != hex.EncodeToString(c.fp[:]):
		// The store's answer is for another request under this key: Redis
		// lost the record it had, and the key was reused meanwhile.
		l.release(c.ctx)
		return false, refuse(ErrKeyReused)
	case a.Status < 100 || a.Status > 999:
		l.end()
		l.letGo()
		return false, refuse(ErrUnreadableRecord)
	}
	rec := m.recordOf(a)
	if a.NotReplayable || len(a.Body) > m.cfg.maxResponse {
		rec = nil // as for an answer recorded over the limit: executed, not replayed
	} else {
		rec.expires = time.Now().Add(m.cfg.recordTTL)
	}
	m.cfg.logger.Info("idempotency: recovered an abandoned execution's committed answer", "key", l.k.record)
	// Replayed even when Redis cannot keep it now: the answer is committed,
	// and the next retry recovers it again. Another executor that stored
	// first (ErrLockLost) stored the same committed answer.
	_, err = l.complete(c.ctx, rec, m.cfg.recordTTL)
	l.end()
	switch {
	case rec == nil:
		return false, refuse(ErrNotReplayable)
	case err == nil:
		m.cache.put(c.id, c.fp, rec, m.cacheExpiry(rec))
	}
	return false, m.replay(c, c.fp, rec)
}
