package faultcheck_test

// A crowd: hundreds of duplicates of one running key on one instance,
// while Redis allows few more connections than the instances' pools hold
// (maxclients). Inside one instance duplicates wait in memory behind one
// leader (inflight.go), and waits on another instance share one pub/sub
// connection (waiter.go); a design that spent a connection per waiter
// would take every connection Redis has left. The promises: every
// duplicate gets the key's one answer, and a fresh key on the instance
// that runs the crowd's key is served meanwhile, not refused 503. Both are
// judged only when no other fault touched Redis or those instances during
// the crowd.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

const (
	ruleCrowdWaiter = "a duplicate in a crowd did not get the key's one answer"
	ruleCrowdFresh  = "a fresh key was refused while a crowd of duplicates waited on another"
)

// Roles of a crowd's keys.
const (
	roleCrowd = "crowd" // the key the crowd waits on
	roleFresh = "fresh" // a key nobody else sends, on the other instance
)

const noteCrowdServed = "crowd duplicates that got the key's one answer"

// crowdWait is the history's wait bound when it has a crowd: every
// duplicate waits out the key's run, however slowly a busy machine lets
// hundreds of them in.
const crowdWait = 5 * time.Second

// crowdMaxclients is Redis's maxclients during a crowd: every connection
// the clients of the rig may hold at once, and a margin. Each instance's
// client, and the check's own, holds at most go-redis's default pool (10
// per CPU, 2 here) and pipeline pool (10); an instance has besides a
// pub/sub connection for each history whose requests wait on the other
// instance, a few at a time. That is 2×(20+10+8) + (20+10) = 106. A crowd
// is 200 duplicates at least: a connection per waiter would not fit.
const crowdMaxclients = 130

// crowdStoreTimeout is the history's store timeout when it has a crowd:
// hundreds of requests on a busy machine slow every round trip, and a
// claim refused for that is not what the crowd is about. Only a refused
// connection fails a claim then.
const crowdStoreTimeout = 2 * time.Second

// crowd draws, in some histories, a crowd: the key runs slowly on one
// instance, its duplicates go to the other, and a fresh key to the first
// while they wait.
func (d drawer) crowd(p *plan) {
	if !d.chance(kindCrowd, 0.06) {
		return
	}
	runs := d.rng.IntN(2)
	start := d.between(100*time.Millisecond, 500*time.Millisecond)
	pause := d.between(200*time.Millisecond, 400*time.Millisecond)
	k := newKey("crowd", "c", routeKey, roleCrowd)
	k.start = start
	k.chain = []*requestPlan{{key: k, at: start, instance: runs, act: actSlow, pause: pause}}
	for range 200 + d.rng.IntN(301) {
		k.extras = append(k.extras, &requestPlan{key: k, at: start + d.between(30*time.Millisecond, pause),
			instance: 1 - runs, act: actNormal})
	}
	fresh := newKey("crowd", "f", routeKey, roleFresh)
	fresh.start = start + pause/2
	fresh.chain = []*requestPlan{{key: fresh, at: fresh.start, instance: runs, act: actNormal}}
	p.keys = append(p.keys, k, fresh)
	p.cfg.Wait, p.cfg.StoreTimeout = crowdWait, crowdStoreTimeout
	p.faults = append(p.faults, &faultPlan{kind: kindCrowd, at: max(start-100*time.Millisecond, 0),
		until: append(k.requests(), fresh.chain...)})
}

// crowdUnderMaxclients lowers Redis's maxclients to crowdMaxclients (or a
// little above the connections open now, should those be more) until the
// crowd's requests are answered, and restores it. Call with r.redisFaults
// held.
func (r *rig) crowdUnderMaxclients(h *history, f *faultPlan) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	was, err := r.storeDB.ConfigGet(ctx, "maxclients").Result()
	if err != nil {
		r.fail("CONFIG GET maxclients: %v", err)
		return "no crowd"
	}
	open, err := connectedClients(ctx, r)
	if err != nil {
		r.fail("INFO clients: %v", err)
		return "no crowd"
	}
	limit := max(crowdMaxclients, open+20)
	if err := r.storeDB.ConfigSet(ctx, "maxclients", strconv.Itoa(limit)).Err(); err != nil {
		r.fail("CONFIG SET maxclients: %v", err)
		return "no crowd"
	}
	bound := time.After(clientBound)
	for _, q := range f.until {
		select {
		case <-h.answered[q]:
		case <-bound:
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.storeDB.ConfigSet(ctx, "maxclients", was["maxclients"]).Err(); err != nil {
		r.fail("restoring maxclients: %v", err)
	}
	return fmt.Sprintf("maxclients %d (%d connections open) for a crowd of %d", limit, open, len(f.until)-2)
}

func connectedClients(ctx context.Context, r *rig) (int, error) {
	info, err := r.storeDB.Info(ctx, "clients").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("INFO clients names no connected_clients")
}

// checkCrowd holds the crowd's key and the fresh key to their promises,
// when nothing but the crowd touched Redis or the instances meanwhile.
func (c *keyCase) checkCrowd() {
	if c.k.role != roleCrowd && c.k.role != roleFresh || len(c.exchanges) == 0 || c.disturbed() {
		return
	}
	if c.k.role == roleFresh {
		c.h.arm(ruleCrowdFresh)
		x := c.exchanges[0]
		if a := read(x).answer; x.status != 201 || a == nil || x.replayed() {
			c.fail(ruleCrowdFresh, "%s on %s got %s", x.req.name, x.instance, replyText(x))
		}
		return
	}
	if len(c.starts) != 1 {
		return // checkExecutions judges
	}
	var exec string
	for e := range c.starts {
		exec = e
	}
	for _, x := range c.exchanges {
		c.h.arm(ruleCrowdWaiter)
		if a := read(x).answer; x.status == 201 && a != nil && a.Exec == exec {
			c.h.note(noteCrowdServed)
			continue
		}
		c.fail(ruleCrowdWaiter, "%s on %s got %s, not the answer of %s", x.req.name, x.instance, replyText(x), c.describe(exec))
	}
}

// disturbed reports whether Redis was out of an instance's reach, or an
// instance down, while maxclients was small or the key's requests ran.
// Late or lost replies cost a claim no more than its store timeout, which
// a crowd's history keeps long.
func (c *keyCase) disturbed() bool {
	from, to := c.exchanges[0].sent, c.exchanges[0].done
	for _, x := range c.exchanges {
		from, to = minTime(from, x.sent), maxTime(to, x.done)
	}
	for _, f := range c.h.faults {
		if f.kind == kindCrowd && f.history == c.h.plan.index {
			from, to = minTime(from, f.from), maxTime(to, f.to)
		}
	}
	for _, f := range c.h.faults {
		switch f.kind {
		case kindRedisStop, kindBlackhole, kindSaturate, kindKill, kindDrain, kindRedisRestart, kindDBStall, kindDBRestart:
			if !f.to.Before(from) && !f.from.After(to) {
				return true
			}
		}
	}
	return false
}
