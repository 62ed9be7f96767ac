package faultcheck_test

// Redis restarting empty: the server is killed and a new one, which keeps
// nothing (no AOF, no RDB), starts on the same port. What the library
// promises across it (docs/operations.md, "A Redis restart without
// persistence"; tokensign.go), and so what is judged:
//
//   - Every record is lost. A key claimed before the restart may run again
//     when claimed after it, only because Redis forgot it: the check
//     counts those runs apart ("counted apart" in the report) and excuses
//     nothing else. A replay of an answer whose record was lost, from a
//     process's memory, is no fault either; and a key whose stored answer
//     was lost may end with no record.
//   - A key first claimed after the restart is held to every rule, as are
//     two claims on the same side of it.
//   - Tokens keep meaning what they meant: the key ring that signs and
//     checks them is configuration (tokenkeys.go), which Redis never held.
//     A spent token whose record the restart lost may be spent again (a
//     run counted apart, as above); no token is ever refused as unknown
//     for it (an uncaused token-not-found).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
)

const ruleRefusedTokenRan = "a token answered token-not-found ran, with no Redis restart between"

// What a restart excuses, counted apart in the report.
const (
	noteRanAgain       = "a key ran again after a Redis restart forgot its record"
	noteForgottenReply = "a replay of an answer whose record a Redis restart lost"
	noteForgottenEnd   = "a key that ran ends with no record after a Redis restart"
)

// restartRedis kills Redis and starts a new, empty one on its port after
// down. Writes are paused first. The restart counts from
// Redis's clock once writes are paused: a claim (a script, which writes)
// whose fencing token is below it was made on the old server, one above
// it on the new. Call with r.redisFaults held.
func (r *rig) restartRedis(down time.Duration, ev *faultEvent) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.storeDB.Do(ctx, "CLIENT", "PAUSE", 5000, "WRITE").Err(); err != nil {
		r.fail("pausing Redis's writes before its restart: %v", err)
		return "no restart"
	}
	paused, err := r.storeDB.Time(ctx).Result()
	if err != nil {
		r.fail("reading Redis's clock: %v", err)
		return "no restart"
	}
	ev.from = paused
	began := time.Now()
	r.store.Stop()
	time.Sleep(down)
	r.store = redistest.Restart(rigT{r}, r.store)
	return fmt.Sprintf("Redis killed; a new, empty one on its port after %v", time.Since(began).Round(time.Millisecond))
}

// rigT lets redistest.Restart report to the rig from any goroutine.
type rigT struct{ r *rig }

func (t rigT) Cleanup(f func())                  { t.r.t.Cleanup(f) }
func (t rigT) Fatalf(format string, args ...any) { t.r.fail(format, args...) }

// issueTokens fetches, before the history begins, the token of each of its
// token-mode keys from the key's issuer. An instance that is down (killed
// or draining for another history) is asked again.
func (r *rig) issueTokens(p *plan) {
	for _, k := range p.keys {
		if k.route != routeForm {
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		for k.token == "" {
			k.token = r.issueToken(p.cfg, k.scope, k.issuer)
			if k.token == "" {
				if time.Now().After(deadline) {
					r.fail("instance %s issued no token for %v within 30 s", instanceName(k.issuer), k)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// issueToken asks instance i for a token for scope; "" when it gives none.
func (r *rig) issueToken(cfg historyConfig, scope string, i int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.instances[i].baseURL()+routeFormToken, nil)
	config, _ := json.Marshal(cfg)
	req.Header.Set(configHeader, string(config))
	req.Header.Set(clientHeader, scope)
	resp, err := r.http.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var t struct{ Token string }
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || json.Unmarshal(b, &t) != nil {
		return ""
	}
	return t.Token
}

// restartAfter reports whether Redis restarted after the claim at fence,
// which may have lost its record.
func (h *history) restartAfter(fence uint64) bool {
	for _, f := range h.faults {
		if f.kind == kindRedisRestart && f.from.After(claimTime(fence)) {
			return true
		}
	}
	return false
}

// forgotten reports whether a Redis restart may have lost the record of
// the claim at fence.
func (c *keyCase) forgotten(fence uint64) bool { return c.h.restartAfter(fence) }

// restartBetween reports whether Redis restarted between the claims at
// fences a and b: the later one may have run only because Redis forgot
// the earlier.
func (h *history) restartBetween(a, b uint64) bool {
	for _, f := range h.faults {
		if f.kind == kindRedisRestart && f.from.After(claimTime(min(a, b))) && f.from.Before(claimTime(max(a, b))) {
			return true
		}
	}
	return false
}

// allForgotten reports whether a Redis restart may have lost the record
// of every execution of the key that took effect: claims after it found
// the key free, and may have run and freed it again.
func (c *keyCase) allForgotten() bool {
	for exec := range c.applied {
		if !c.forgotten(c.starts[exec].Fence) {
			return false
		}
	}
	return true
}

// forgottenRuns counts the executions among attempts (in claim order) that
// ran only because a Redis restart forgot the one before, and reports
// whether that accounts for all but the first. A restart forgets a claim,
// not an answer stored after it: the store writes a vanished record back
// (complete.lua), so a claim made well after the earlier execution's
// client got its answer from the new Redis is not excused.
func (c *keyCase) forgottenRuns(attempts []trace) (n int, all bool) {
	for i := 1; i < len(attempts); i++ {
		before, after := c.starts[attempts[i-1].Exec], c.starts[attempts[i].Exec]
		if c.h.restartBetween(before.Fence, after.Fence) && !c.writtenBackBefore(before, after) {
			n++
		}
	}
	return n, n == len(attempts)-1
}

// writtenBackBefore reports whether the answer of execution e was stored in
// Redis as it was after the last restart before the claim of next: e took
// effect after that restart, its client had its answer a second or more
// before the claim, and nothing came between e's instance and Redis
// meanwhile, so the store, or its write-back, had landed.
func (c *keyCase) writtenBackBefore(e, next trace) bool {
	effect, ok := c.applied[e.Exec]
	claimed := claimTime(next.Fence)
	if !ok {
		return false
	}
	for _, f := range c.h.faults {
		if f.kind == kindRedisRestart && f.from.Before(claimed) && !f.to.Before(time.Unix(0, effect.At)) {
			return false // the restart was not over when e took effect
		}
	}
	if c.h.disturbed(instanceIndex(e.Instance), time.Unix(0, effect.At), claimed) {
		return false
	}
	return slices.ContainsFunc(c.exchanges, func(x *exchange) bool {
		a := read(x).answer
		return a != nil && a.Exec == e.Exec && !x.replayed() && x.status/100 == 2 && x.done.Add(time.Second).Before(claimed)
	})
}

// checkTokens: what a token-mode key's token-not-found answers told.
func (c *keyCase) checkTokens() {
	if c.k.route != routeForm {
		return
	}
	for _, x := range c.exchanges {
		if read(x).problem == "token-not-found" {
			c.checkRefusedToken(x)
		}
	}
}

// checkRefusedToken holds x, answered token-not-found, to what that answer
// tells the user: this token never ran and never will (the form asks for a
// new one, and its submission runs). Only a Redis restart between the
// refusal and a run excuses it: a restart forgets a spent token's record
// (the token was spent, then revoked, and its record lost).
func (c *keyCase) checkRefusedToken(x *exchange) {
	c.h.arm(ruleRefusedTokenRan)
	for exec, s := range c.starts {
		at := time.Unix(0, s.At)
		from, to := minTime(at, x.done), maxTime(at, x.done)
		restarted := slices.ContainsFunc(c.h.faults, func(f faultEvent) bool {
			return f.kind == kindRedisRestart && f.to.After(from) && f.from.Before(to)
		})
		if !restarted {
			c.fail(ruleRefusedTokenRan, "%s on %s got token-not-found, and %s ran the token", x.req.name, x.instance, c.describe(exec))
		}
	}
}

// restartMidRun stages, in some histories with restarts, a restart in the
// middle of a handler's run, on a key of its own: the claim's record is
// lost, the handler takes effect once Redis is back, and its store finds
// the record gone and writes the answer back (complete.lua), so that a
// retry well after the answer replays it rather than running again.
func (d drawer) restartMidRun(p *plan) {
	if !d.chance(kindRedisRestart, 0.25) {
		return
	}
	k := newKey(scopes[d.rng.IntN(len(scopes))], "kr", routeKey, "")
	k.start = d.between(0, 200*time.Millisecond)
	first := &requestPlan{key: k, at: k.start, instance: d.rng.IntN(2), act: actSlow, deaf: true,
		pause: d.between(1000*time.Millisecond, 1300*time.Millisecond)}
	retry := &requestPlan{key: k, at: d.between(1200*time.Millisecond, 1500*time.Millisecond), instance: d.rng.IntN(2), act: actNormal}
	k.chain = []*requestPlan{first, retry}
	p.keys = append(p.keys, k)
	p.faults = append(p.faults, &faultPlan{kind: kindRedisRestart, anchor: first,
		at: d.between(100*time.Millisecond, 250*time.Millisecond), dur: d.between(50*time.Millisecond, 150*time.Millisecond)})
}
