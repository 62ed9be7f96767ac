package idempotency_test

// A revocation: the operator revokes every token out, as
// docs/operations.md says (a new secret in PREFIX:token-secret), in the
// late phase of some histories with token-mode keys (faultcheck_recheck_test.go).
// Each such key has a spare: a token issued to the same caller by the same
// instance before the history began, and sent only once every instance has
// rechecked the secret, to each instance. The promise: a token the
// revocation caught unspent is refused (422 token-not-found) everywhere and
// runs nothing, while every spent token still replays (checkLate).

import (
	"context"
	"crypto/rand"
	"time"
)

const ruleRevokedTokenSpent = "a token unspent when its secret was revoked ran after the revocation"

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

// revoke writes a new token secret for the history's prefix, as an
// operator who revokes every token out does. The secret it replaces is
// read first: the tokens it signed are the history's.
func (r *rig) revoke(h *history) {
	secret := make([]byte, 32)
	rand.Read(secret)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefix := h.plan.cfg.Prefix
	if err := r.secrets.read(ctx, r.storeDB, prefix); err != nil {
		r.fail("reading the token secret before its revocation: %v", err)
	}
	if err := r.storeDB.Set(ctx, prefix+":token-secret", secret, 0).Err(); err != nil {
		r.fail("revoking the token secret: %v", err)
	}
}

// sendSpares sends each spare's token to each instance, once the instances
// have rechecked the secret.
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
