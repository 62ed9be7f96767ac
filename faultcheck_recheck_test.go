package idempotency_test

// After the rechecks: in some histories with a Redis restart, each
// token-mode key is sent once more to its issuer, which spends its token
// again if the restart forgot it. Then one instance is started anew, as a
// new instance comes up after a restart: its middleware reads the secret
// from Redis, where nobody may have written back the one the fleet held,
// and makes a new one. Once every instance has rechecked the shared token
// secret twice (tokensign.go: every 10 s, in the background of an issue
// or a check, which the phase prompts), each key is sent once more to each
// instance. By then the fleet agrees: an instance that held another
// secret than Redis has adopted Redis's and retired its own, in Redis, and
// every instance has read the retired ones. The promise
// (docs/operations.md): a token that was spent still finds its record and
// replays, on every instance; one of a retired secret that was not spent
// is refused and runs nothing (checkTokens: no instance spends a token of
// a secret it does not hold). No token is spent under a secret Redis does
// not keep (tokenconfirm.go), so a secret whose only holder stopped before
// its recheck has spent nothing. A restart waits for the phase to end; a
// key whose record a restart before it lost is not judged, nor any when
// the instances were out of Redis's reach too long during the prompts.

import (
	"context"
	"slices"
	"time"

	"github.com/onceonly/idempotency/admin"
)

const ruleSpentTokenRefused = "a spent token was refused after every instance rechecked the token secrets"

const (
	noteLateReplay = "a spent token replayed after every instance rechecked the token secrets"
	noteLookupOnly = "of those, by an instance that holds another secret (lookup-only)"
)

// lateWait is how long the phase prompts the rechecks, Redis in reach,
// before its requests. Every middleware of the history loaded its secret
// before the prompts began, so each rechecks within secretRecheck (10 s)
// and the prompts' period, when the one that held another secret adopts
// Redis's; and each again within as long, having read what that one
// retired. A recheck that meets an outage is tried again a second later:
// the time an instance is out of Redis's reach does not count, and an
// instance started anew meanwhile loads its secret anew, so the time
// counts from then.
const lateWait = 2*10*time.Second + 4*time.Second

// lateBound bounds the prompts; a phase whose instances never had lateWait
// in Redis's reach is not judged.
const lateBound = 60 * time.Second

// agreed reports whether, since the prompts began at from, every instance
// has had lateWait in Redis's reach since it last started.
func (r *rig) agreed(from time.Time) bool {
	now := time.Now()
	faults := r.timeline.between(from, now)
	for i := range r.instances {
		since := from
		for _, f := range faults {
			if (f.kind == kindKill || f.kind == kindDrain) && f.instance == i {
				since = maxTime(since, f.to)
			}
		}
		out, _ := outage(faults, i, since, now)
		if now.Sub(since)-out < lateWait {
			return false
		}
	}
	return true
}

// lateAllowance is how much longer than others a history with the phase
// may take: the prompts' bound and the rest of the phase. A bounded run is
// too short for it.
const lateAllowance = lateBound + 6*time.Second

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
	if !d.kinds[kindKill] || revoke {
		// -idem.faults or -idem.skip leave kills out. A revocation's
		// history restarts no instance, here or by a kill or a drain: an
		// instance started around a revocation may never learn the revoked
		// secret (its holder retires it at its recheck, up to 10 s later),
		// and refuses the tokens it spent (token-not-found): a known defect
		// of a secret kept in Redis, which a key ring from the
		// configuration removes; a 30-minute run found it 42 times.
		p.lateRenew = -1
	}
	for _, k := range forms {
		k.late = []*requestPlan{{key: k, instance: k.issuer, act: actNormal}}
		for i := range 2 {
			k.late = append(k.late, &requestPlan{key: k, instance: i, act: actNormal})
		}
	}
}

// late runs the phase once the history has settled: each token-mode key
// sent to its issuer; an instance started anew; then every instance
// issues tokens to the keys' callers for lateWait (each issue may start a
// recheck); then what each key's record holds is read, and the key sent
// to each instance.
func (r *rig) late(h *history) {
	r.restarts.RLock()
	defer r.restarts.RUnlock()
	if h.plan.revoke {
		h.count(kindRevoke)
	} else {
		h.count(kindRedisRestart + ", then the rechecks")
	}
	var forms []*keyPlan
	for _, k := range h.plan.keys {
		if len(k.late) > 0 && k.role != roleSpare {
			forms = append(forms, k)
			r.send(h, k.late[0])
		}
	}
	if h.plan.revoke {
		r.revoke(h)
	}
	if h.plan.lateRenew >= 0 {
		r.renew(h, r.instances[h.plan.lateRenew])
	}
	h.latePrompts = time.Now()
	for !r.agreed(h.latePrompts) {
		if time.Since(h.latePrompts) > lateBound {
			h.lateUnsure = true
			break
		}
		for i := range r.instances {
			for _, k := range forms {
				r.issueToken(h.plan.cfg, k.scope, i)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := r.operator(h.plan.cfg)
	h.lateRead, h.lateStates = time.Now(), map[*keyPlan]*admin.KeyState{}
	var book secretBook
	book.begin(h.plan.cfg.Prefix)
	if err := book.read(ctx, r.storeDB, h.plan.cfg.Prefix); err != nil {
		r.fail("reading the token secrets: %v", err)
		return
	}
	h.lateKnown = book.of(h.plan.cfg.Prefix)
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
	ev.what = "a new instance after the Redis restart: " + r.killAndRestart(p, 0, &ev)
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
	if c.h.lateUnsure {
		return
	}
	own := signer(c.h.secrets, c.cfg.Prefix, c.k.scope, c.k.token)
	lost := signer(c.h.lateKnown, c.cfg.Prefix, c.k.scope, c.k.token) < 0
	for _, x := range c.exchanges {
		if !slices.Contains(c.k.late[1:], x.req) {
			continue
		}
		c.h.arm(ruleSpentTokenRefused)
		switch rd := read(x); {
		case rd.problem == "token-not-found":
			why := ""
			if lost {
				why = "; Redis keeps the token's secret neither as the secret nor as a retired one"
			}
			c.fail(ruleSpentTokenRefused, "%s on %s was refused token-not-found; the token's record reads %s%s",
				x.req.name, x.instance, stateText(st), why)
		case rd.answer != nil && x.replayed():
			c.h.note(noteLateReplay)
			if held := c.heldAround(x.req.name, time.Unix(0, 0), x.done, true); held >= 0 && held != own {
				c.h.note(noteLookupOnly)
			}
		}
	}
}
