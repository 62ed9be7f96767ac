package faultcheck_test

// What a live process holds is never lost (later.go): an answer whose
// store Redis did not take waits in the background queue, however long
// the outage, and is stored once Redis answers. Without
// WithRetryAbandoned nobody else can take a key over from its executor,
// so the answer of a handler that ran to its 201 is the key's in the end,
// unless its process was killed or drained first (the drain has rules of
// its own), or a Redis restart lost its record.

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/onceonly/idempotency/admin"
)

const ruleAnswerLost = "the answer of a handler whose process lived on was never stored"

const noteUndecided = "an answer not stored yet when the check gave up waiting for a quiet moment"

// checkStored holds the key's latest execution to the promise.
func (c *keyCase) checkStored() {
	e := c.last
	if c.cfg.RetryAbandoned && c.k.role != roleVictim || e == nil || !c.answered(*e) {
		return // a saturation's victim has no retry that could take it over
	}
	if c.forgotten(e.Fence) || c.h.ended(e.Exec) {
		return
	}
	if c.h.undecided[c.k] {
		c.h.note(noteUndecided)
		return
	}
	c.h.arm(ruleAnswerLost)
	if c.stored() && c.state.Fence == e.Fence {
		return
	}
	c.fail(ruleAnswerLost, "%s answered 201 after its effect, and its process lived on, yet the key ends %s",
		c.describe(e.Exec), stateText(c.state))
}

// answered reports whether execution e ran its handler to an answer that
// the middleware stores: its effect applied, then 201 (a slow handler's
// linger does not look at its context).
func (c *keyCase) answered(e trace) bool {
	return c.hasApplied(e.Exec) && (e.Act == actNormal || e.Act == actSlow)
}

// ended reports whether the process that ran exec was killed or drained
// during the history.
func (h *history) ended(exec string) bool {
	for _, f := range h.faults {
		if (f.kind == kindKill || f.kind == kindDrain) && ranOn(exec, f) {
			return true
		}
	}
	return false
}

// ranOn reports whether exec ran on the process that fault f ended: an
// execution's id begins with its instance's name and process id.
func ranOn(exec string, f faultEvent) bool {
	return f.pid != 0 && strings.HasPrefix(exec, instanceName(f.instance)+strconv.Itoa(f.pid)+".")
}

func instanceName(i int) string { return string(rune('a' + i)) }

// awaitStores gives an answer that waits in a live process's background
// queue the time to land, which the history's settling does not wait for:
// a key whose latest execution answered reads claimed, with no lock, until
// its store lands, within about a second once Redis answers the instance
// again. So it waits until the instance has been free of faults for
// storeQuiet, for awaitStoresBound at most; a key still waiting then, its
// instance never quiet for long enough, is left undecided.
func (r *rig) awaitStores(ctx context.Context, h *history, m *admin.Operator) error {
	deadline := time.Now().Add(awaitStoresBound)
	for _, k := range h.plan.keys {
		st := h.states[k]
		if st == nil {
			continue
		}
		e := h.awaited(k, st.Fence)
		for e != nil && st.State == "run" && st.Lock == "" {
			if r.quiet(instanceIndex(e.Instance), storeQuiet) {
				break // it had its chance
			}
			if time.Now().After(deadline) {
				h.undecided[k] = true
				break
			}
			time.Sleep(100 * time.Millisecond)
			again, err := m.Inspect(ctx, st.Key)
			if err != nil {
				return err
			}
			st = &again
		}
		h.states[k] = st
	}
	return nil
}

const (
	storeQuiet       = 2 * time.Second
	awaitStoresBound = 30 * time.Second
)

// quiet reports whether no fault touched instance i, or Redis, within the
// last d (a lost reply aside, which costs a store one try).
func (r *rig) quiet(i int, d time.Duration) bool {
	for _, f := range r.timeline.between(time.Now().Add(-d), time.Now()) {
		if (f.instance == i || f.instance == -1) && f.kind != kindDropReply {
			return false
		}
	}
	return true
}

// awaited returns the key's execution of the given fence when it answered
// 201 on a process that lives on: its store may still be on its way.
func (h *history) awaited(k *keyPlan, fence uint64) *trace {
	var start *trace
	applied := false
	for _, tr := range h.traces[k] {
		switch {
		case tr.Kind == traceStart && tr.Fence == fence:
			start = &tr
		case tr.Kind == traceEffect && tr.Fence == fence:
			applied = true
		}
	}
	if start == nil || !applied || start.Act != actNormal && start.Act != actSlow || h.ended(start.Exec) {
		return nil
	}
	return start
}
