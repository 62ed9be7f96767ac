package faultcheck_test

// A revocation: the operator revokes the key that signed every token out,
// as docs/operations.md says (the ring's signing key becomes a new one,
// the old one revoked, on every instance), in the late phase of some
// histories with token-mode keys (late_test.go). Each such key
// has a spare: a token issued to the same caller by the same instance
// before the history began, and sent only after the revocation, to each
// instance. The promise: a token the revocation caught unspent is refused
// (422 token-not-found) everywhere and runs nothing, while every spent
// token still replays (checkLate).

import (
	"math/rand/v2"
	"strings"
	"time"
)

const ruleRevokedTokenSpent = "a token unspent when its key was revoked ran after the revocation"

// roleSpare is a key whose token is sent only after a revocation.
const roleSpare = "spare"

// spares adds a spare to each token-mode key of forms.
func (d drawer) spares(p *plan, forms []*keyPlan) {
	p.revoke = true
	for _, k := range forms {
		spare := newKey(k.scope, k.id+"-spare", routeForm, roleSpare)
		spare.issuer = k.issuer
		for i := range 2 {
			spare.late = append(spare.late, &requestPlan{key: spare, instance: i, act: actNormal})
		}
		p.keys = append(p.keys, spare)
	}
}

// revoke gives the history's instances a new key ring, as a rolling
// restart with the new configuration does: a new key signs, and the one
// that signed the history's tokens is revoked. Every request from here on
// carries it.
func (r *rig) revoke(h *history) {
	old := strings.TrimPrefix(h.plan.cfg.TokenKeys, "sign=")
	rng := rand.New(rand.NewPCG(uint64(h.plan.index), 1))
	h.plan.cfg.TokenKeys = "sign=" + drawKey(rng) + " revoked=" + old
	h.revoked = time.Now()
}

// sendSpares sends each spare's token to each instance, after the
// revocation.
func (r *rig) sendSpares(h *history) {
	for _, k := range h.plan.keys {
		if k.role == roleSpare {
			for _, q := range k.late {
				r.send(h, q)
			}
		}
	}
}

// checkRevoked: a spare's token ran nothing.
func (c *keyCase) checkRevoked() {
	if c.k.role != roleSpare {
		return
	}
	c.h.arm(ruleRevokedTokenSpent)
	for exec := range c.starts {
		c.fail(ruleRevokedTokenSpent, "%s ran the token of %s, which the revocation caught unspent", c.describe(exec), c.k)
	}
}
