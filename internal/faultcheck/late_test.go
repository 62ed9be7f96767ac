package faultcheck_test

// The late phase, once a history has settled: in some histories with a
// Redis restart, and in those with a revocation, each token-mode key is
// sent once more to its issuer (which spends its token again if a restart
// forgot it), one instance is started anew, the key ring may revoke the
// key that signed the history's tokens (revoke_test.go), and
// each key is sent once more to each instance. The promise
// (docs/operations.md, "Token keys"): a token that was spent still finds
// its record and replays, on every instance, whatever the ring did to its
// key and however the instances restarted; one of a revoked key that was
// not spent is refused and runs nothing (checkRevoked). A restart waits
// for the phase to end; a key whose record a restart before it lost is not
// judged.

import (
	"context"
	"slices"
	"time"

	"github.com/onceonly/idempotency/admin"
)

const ruleSpentTokenRefused = "a spent token was refused in the late phase, its record kept"

const noteLateReplay = "a spent token replayed in the late phase"

// lateAllowance is how much longer than others a history with the phase
// may take. A bounded run is too short for it.
const lateAllowance = 8 * time.Second

// late draws the phase in a third of the histories with a Redis restart and
// token-mode keys, and in those with a revocation: a request of each such
// key to its issuer, then one to each instance.
func (d drawer) late(p *plan) {
	restarts := slices.ContainsFunc(p.faults, func(f *faultPlan) bool { return f.kind == kindRedisRestart })
	forms := slices.DeleteFunc(slices.Clone(p.keys), func(k *keyPlan) bool { return k.route != routeForm })
	if len(forms) == 0 {
		return
	}
	revoke := d.chance(kindRevoke, 0.5)
	if !revoke && (!restarts || d.rng.IntN(3) != 0) {
		return
	}
	if revoke {
		d.spares(p, forms)
	}
	p.late, p.lateRenew = true, d.rng.IntN(2)
	if !d.kinds[kindKill] {
		p.lateRenew = -1 // -idem.faults or -idem.skip leave kills out
	}
	for _, k := range forms {
		k.late = []*requestPlan{{key: k, instance: k.issuer, act: actNormal}}
		for i := range 2 {
			k.late = append(k.late, &requestPlan{key: k, instance: i, act: actNormal})
		}
	}
}

// late runs the phase once the history has settled: each token-mode key
// sent to its issuer; an instance started anew; the revocation; then what
// each key's record holds is read, and the key sent to each instance.
func (r *rig) late(h *history) {
	r.restarts.RLock()
	defer r.restarts.RUnlock()
	if h.plan.revoke {
		h.count(kindRevoke)
	} else {
		h.count(kindRedisRestart + ", then the late phase")
	}
	var forms []*keyPlan
	for _, k := range h.plan.keys {
		if len(k.late) > 0 && k.role != roleSpare {
			forms = append(forms, k)
			r.send(h, k.late[0])
		}
	}
	if h.plan.lateRenew >= 0 {
		r.renew(h, r.instances[h.plan.lateRenew])
	}
	if h.plan.revoke {
		r.revoke(h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := r.operator(h.plan.cfg)
	h.lateRead, h.lateStates = time.Now(), map[*keyPlan]*admin.KeyState{}
	for _, k := range forms {
		record, err := r.recordOf(ctx, h, k)
		if err != nil {
			r.fail("reading the traces of %v: %v", k, err)
			return
		}
		if record == "" {
			continue // never claimed by a handler's run
		}
		st, err := m.Inspect(ctx, record)
		if err != nil {
			r.fail("inspecting %s: %v", record, err)
			return
		}
		h.lateStates[k] = &st
	}
	for _, k := range forms {
		for _, q := range k.late[1:] {
			r.send(h, q)
		}
	}
	r.sendSpares(h)
}

// renew starts instance p anew: a kill, on the timeline as any kill.
func (r *rig) renew(h *history, p *instanceProc) {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	ev := faultEvent{kind: kindKill, instance: slices.Index(r.instances, p), history: h.plan.index, from: time.Now()}
	id := r.timeline.begin(ev)
	ev.what = "a new instance in the late phase: " + r.killAndRestart(p, 0, &ev)
	ev.to = time.Now()
	r.timeline.end(id, ev)
}

// checkLate holds a token-mode key's late requests to the promise.
func (c *keyCase) checkLate() {
	st := c.h.lateStates[c.k]
	if len(c.k.late) == 0 || st == nil || st.State == "none" {
		return
	}
	for _, f := range c.h.faults {
		if f.kind == kindRedisRestart && !f.to.Before(c.h.lateRead) {
			return
		}
	}
	for _, x := range c.exchanges {
		if !slices.Contains(c.k.late[1:], x.req) {
			continue
		}
		c.h.arm(ruleSpentTokenRefused)
		switch rd := read(x); {
		case rd.problem == "token-not-found":
			c.fail(ruleSpentTokenRefused, "%s on %s was refused token-not-found; the token's record reads %s",
				x.req.name, x.instance, stateText(st))
		case rd.answer != nil && x.replayed():
			c.h.note(noteLateReplay)
		}
	}
}
