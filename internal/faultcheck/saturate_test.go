package faultcheck_test

// Saturation: an outage at load. A few slow handlers (victims) run on one
// instance when its way to Redis is cut; their stores fail and wait in
// the background queue. Then hundreds of new keys (the burst) arrive
// over a second or so while the cut lasts: the first are admitted, wait
// out their store timeout and each leave the undo of a claim behind, and
// once 64 jobs wait on a failing Redis the queue's admission refuses the
// later ones at once (later.go). The promises: a refused request gets 503 store-unavailable
// with Retry-After (readProblem checks the header) and runs nothing;
// every victim's answer is stored once Redis is back (checkStored);
// nothing runs twice (checkExecutions).

import (
	"fmt"
	"time"
)

const ruleRefusedRan = "a request refused 503 store-unavailable during a saturation ran its handler"

// Roles of a saturation's keys.
const (
	roleVictim = "victim" // a slow handler that answers into the outage
	roleBurst  = "burst"  // one of the new keys that arrive during it
)

const (
	noteBurstRefused = "burst requests refused 503 store-unavailable during a saturation"
	noteBurstAtOnce  = "of those, refused at once, not after their store timeout (the queue's admission)"
)

// saturation draws, in some histories, an outage at load on one instance:
// its victims, its burst and the cut.
func (d drawer) saturation(p *plan) {
	if !d.chance(kindSaturate, 0.06) {
		return
	}
	inst := d.rng.IntN(2)
	start := d.between(0, 500*time.Millisecond)
	pause := d.between(300*time.Millisecond, 500*time.Millisecond)
	for i := range 4 + d.rng.IntN(9) {
		k := newKey("sat", fmt.Sprintf("v%d", i), routeKey, roleVictim)
		k.start = start
		k.chain = []*requestPlan{{key: k, at: start, instance: inst, act: actSlow, pause: pause + d.between(0, 50*time.Millisecond)}}
		p.keys = append(p.keys, k)
	}
	// The cut begins once the victims have claimed (a victim whose claim
	// meets it on a slow machine is refused, and is no victim), and the
	// burst comes once their stores have failed: three tries, each within
	// the store timeout. It lasts long enough for the undos of its first
	// requests to fill the queue before its last ones come.
	cut := start + 150*time.Millisecond
	burst := start + pause + 3*p.cfg.StoreTimeout + 300*time.Millisecond
	spread := 3*p.cfg.StoreTimeout + 600*time.Millisecond
	for i := range 200 + d.rng.IntN(201) {
		k := newKey("sat", fmt.Sprintf("b%d", i), routeKey, roleBurst)
		k.start = burst + d.between(0, spread)
		k.chain = []*requestPlan{{key: k, at: k.start, instance: inst, act: actNormal}}
		p.keys = append(p.keys, k)
	}
	end := burst + spread + p.cfg.StoreTimeout + d.between(300*time.Millisecond, time.Second)
	p.faults = append(p.faults, &faultPlan{kind: kindSaturate, at: cut, dur: end - cut, instance: inst})
}

// checkBurst: a burst request refused 503 store-unavailable ran nothing.
// One that came when Redis answered again ran once, as any request does.
func (c *keyCase) checkBurst() {
	if c.k.role != roleBurst {
		return
	}
	for _, x := range c.exchanges {
		if read(x).problem != "store-unavailable" {
			continue
		}
		c.h.note(noteBurstRefused)
		c.h.arm(ruleRefusedRan)
		if x.done.Sub(x.sent) < c.cfg.StoreTimeout/2 {
			c.h.note(noteBurstAtOnce)
		}
		for exec, s := range c.starts {
			if s.Request == x.req.name {
				c.fail(ruleRefusedRan, "%s was refused store-unavailable, and %s ran", x.req.name, c.describe(exec))
			}
		}
	}
}
