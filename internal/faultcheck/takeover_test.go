package faultcheck_test

// A staged takeover, drawn in some histories (most under
// WithRetryAbandoned; without it, the retry must wait for the first
// executor, whose claim horizon has not passed): the moment random faults
// seldom hit. A key's first executor, deaf to its
// context, is cut off from Redis past its lease; a retry on the other
// instance takes the key over and runs slowly; the cut ends while it runs,
// so that the first executor's answer, stored from its background, lands
// during its successor's run; a last request comes once both are over. In
// a third of them the successor gives the key up instead (Release, or a
// panic before its status), and the first executor's process is killed
// after its effect: the undone takeover must hand the key back to it, not
// free it. In a quarter of them nothing fails: the first executor is slow
// and live, and the retry must wait for it (a lease renewed too late lets
// it take the key over). The promises at stake are the usual ones: the stale answer is
// never the key's (a replay is of the stored answer: ruleReplayDiffers),
// and nothing frees or overwrites a claim whose executor took effect.

import "time"

const kindTakeover = "takeover"

// takeover stages the sequence on a key of its own.
func (d drawer) takeover(p *plan) {
	if !d.chance(kindTakeover, 0.4) {
		return
	}
	p.cfg.RetryAbandoned = d.rng.IntN(3) > 0
	lease := p.cfg.Lease
	k := newKey(scopes[d.rng.IntN(len(scopes))], "kt", routeKey, "")
	k.start = d.between(0, 200*time.Millisecond)
	a := d.rng.IntN(2)
	first := &requestPlan{key: k, at: k.start, instance: a, act: actSlow, deaf: true,
		pause: lease + d.between(200*time.Millisecond, 500*time.Millisecond)}
	k.chain = []*requestPlan{first}
	cut := d.between(50*time.Millisecond, 100*time.Millisecond)
	retake := &requestPlan{key: k, at: k.start + lease + d.between(150*time.Millisecond, 300*time.Millisecond),
		instance: 1 - a, act: actSlow, pause: d.between(700*time.Millisecond, 1100*time.Millisecond)}
	last := &requestPlan{key: k, at: k.start + lease + 2500*time.Millisecond, instance: a, act: actNormal}
	k.extras = []*requestPlan{retake, last}
	p.keys = append(p.keys, k)
	if d.rng.IntN(4) == 0 {
		// No fault at all: the first executor, slow and live, renews its
		// lease past the retry's claim, which must wait for its answer.
		// Any fault on the way to Redis, this history's or another's,
		// would excuse a takeover, so the history runs alone.
		p.alone = true
		p.cfg.RetryAbandoned = true
		p.cfg.ExecTimeout = max(p.cfg.ExecTimeout, 3*lease)
		first.deaf, first.pause = false, 2*lease+d.between(100*time.Millisecond, 300*time.Millisecond)
		retake.at, retake.act, retake.pause = k.start+lease*3/2, actNormal, 0
		return
	}
	p.faults = append(p.faults, &faultPlan{kind: kindBlackhole, anchor: first, at: cut, instance: a,
		dur: lease + d.between(400*time.Millisecond, 800*time.Millisecond)})
	if p.cfg.RetryAbandoned && d.rng.IntN(3) == 0 {
		retake.act = []string{actRelease, actPanicBefore}[d.rng.IntN(2)]
		retake.pause = d.between(100*time.Millisecond, 300*time.Millisecond)
		k.extras = k.extras[:1]
		p.faults = append(p.faults, &faultPlan{kind: kindKill, anchor: first, instance: a,
			at: first.pause + d.between(50*time.Millisecond, 150*time.Millisecond), dur: 100 * time.Millisecond})
	}
}
