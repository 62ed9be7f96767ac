package faultcheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/onceonly/idempotency/internal/keyspace"
)

// loseTakeovers is the lost-takeovers fault of the steps workload, aimed
// at key k, whose first run journaled a step on instance f.instance. A
// takeover records one previous owner, and undoing it (its claim's reply
// was lost) hands the key back to that owner; this fault chains two such
// takeovers and lands their undos in the order that tests the chain:
//
//  1. the key's instance is killed mid-run (and restarted after f.dur):
//     its run, journal and all, is abandoned once its lock lapses;
//  2. the instance whose retry takes it over first hears nothing from
//     Redis from that claim's reply on: its claim's undo waits in its
//     queue;
//  3. once that claim's lock lapsed in turn, the other instance takes the
//     key over from it, its claim's reply lost the same way, past a
//     resend, for a short while: its undo lands, and hands the key back to
//     the first takeover, with nobody before it;
//  4. the second instance is cut off again until the record shows the
//     first one's undo landed, so that no retry of its claims the key in
//     between; then the first one hears Redis again.
//
// The next claim must resume the first run: its journaled steps never run
// again. Each kill and blackhole goes on the timeline as a fault of its
// own. While a fault of another history holds the key's instance or
// either proxy, it is a plain kill.
func (r *rig) loseTakeovers(h *stepsHistory, k *stepsKey, f *faultPlan) {
	x := r.instances[f.instance]
	cfg := h.plan.cfg
	record := r.stepsRecord(h, k)
	locks := []*sync.Mutex{&x.lifecycle, &r.instances[0].proxyFaults, &r.instances[1].proxyFaults}
	// A key with no run to take over yet, or whose instance or proxies
	// another fault holds, gets a plain kill, which takes the instance's
	// lock itself: none of the three may be held here then.
	if record == "" || !tryLockAll(locks) {
		r.inject(h.run, &faultPlan{kind: kindKill, instance: f.instance, dur: f.dur})
		return
	}
	defer locks[2].Unlock()
	defer locks[1].Unlock()
	// Both ears armed before the kill: a takeover comes as soon as the
	// run's lock lapses, on whichever instance a retry reaches. A
	// takeover's reply says "retaken".
	deaf := [2]<-chan struct{}{}
	ended := [2]func(what string, pid int){}
	for i, p := range r.instances {
		deaf[i] = p.proxy.BlackholeAtReply(record, "retaken")
		ended[i] = r.beginFault(h.run, faultEvent{kind: kindBlackhole, instance: i})
		defer p.proxy.EndBlackhole()
		defer p.proxy.Disarm()
	}
	endKill := r.beginFault(h.run, faultEvent{kind: kindKill, instance: f.instance})
	var kill faultEvent
	what := r.killAndRestart(x, f.dur, &kill)
	x.lifecycle.Unlock()
	endKill(what, kill.pid)
	arrive := 2*cfg.Lease + time.Second // for a lock to lapse, and a retry to come
	var first int
	select {
	case <-deaf[0]:
		first = 0
	case <-deaf[1]:
		first = 1
	case <-time.After(arrive):
		for i, p := range r.instances {
			p.proxy.Disarm()
			ended[i](fmt.Sprintf("lost-takeovers: %s took no run over within %v", p.name, arrive), 0)
		}
		return
	}
	one, other := r.instances[first], r.instances[1-first]
	other.proxy.Disarm()
	select {
	case <-deaf[1-first]: // both at once: one was a resend, or a claim that found the key held
		for i, p := range r.instances {
			ended[i](fmt.Sprintf("lost-takeovers: %s deaf to Redis from a takeover's reply on", p.name), 0)
		}
		return
	default:
	}
	deaf[1-first] = other.proxy.BlackholeAtReply(record, "retaken")
	select {
	case <-deaf[1-first]:
	case <-time.After(arrive):
		other.proxy.Disarm()
		ended[1-first](fmt.Sprintf("lost-takeovers: %s took no run over within %v", other.name, arrive), 0)
		ended[first](fmt.Sprintf("lost-takeovers: %s deaf to Redis from a takeover's reply on", one.name), 0)
		return
	}
	hole := 2*cfg.StoreTimeout + 200*time.Millisecond // past a claim and its resend
	time.Sleep(hole)
	other.proxy.EndBlackhole()
	// The other's undo lands (its queue tries every 500 ms at most), then
	// it is cut off again, before a retry of its claims the key.
	handedBack := r.awaitRecord(record, time.Second, func(rec keyspace.Record) bool {
		return rec.State != "run" || rec.PrevOwner == ""
	})
	other.proxy.StartBlackhole()
	// The first one's undo lands once it hears Redis again.
	one.proxy.EndBlackhole()
	r.awaitRecord(record, time.Second, func(rec keyspace.Record) bool {
		return rec.State != "run" || strings.HasPrefix(rec.Owner, "!")
	})
	other.proxy.EndBlackhole()
	what = fmt.Sprintf("lost-takeovers: %s deaf to Redis from a takeover's reply on", one.name)
	if !handedBack {
		what += "; the key was not handed back to its claim"
	}
	ended[first](what, 0)
	ended[1-first](fmt.Sprintf("lost-takeovers: %s deaf to Redis from a takeover's reply on, for %v, "+
		"then again until %s's undo landed", other.name, hole, one.name), 0)
}

// tryLockAll locks every one of locks, or, when one is held, none.
func tryLockAll(locks []*sync.Mutex) bool {
	for i, l := range locks {
		if !l.TryLock() {
			for _, held := range locks[:i] {
				held.Unlock()
			}
			return false
		}
	}
	return true
}

// stepsRecord is the name of k's record, from its first run's trace.
func (r *rig) stepsRecord(h *stepsHistory, k *stepsKey) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lines, _ := r.effectsDB.LRange(ctx, stepsTraceKey(h.plan.cfg.Prefix, k.scope, k.id), 0, -1).Result()
	for _, l := range lines {
		var tr stepTrace
		if json.Unmarshal([]byte(l), &tr) == nil && tr.Kind == stepStart && tr.Record != "" {
			return tr.Record
		}
	}
	return ""
}

// awaitRecord polls the record named record, for up to d, until it is
// gone or done reports true of it; it reports whether one of them
// happened.
func (r *rig) awaitRecord(record string, d time.Duration, done func(rec keyspace.Record) bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		text, err := r.keys.record(ctx, record)
		cancel()
		if err != nil {
			continue
		}
		if rec, ok := keyspace.ParseRecord(text); text == "" || ok && done(rec) {
			return true
		}
	}
	return false
}

// beginFault puts a fault of the history on the timeline as it begins;
// the function it returns ends it, with what it did and, for a kill, the
// process it ended.
func (r *rig) beginFault(h *history, ev faultEvent) func(what string, pid int) {
	ev.history, ev.from = h.plan.index, time.Now()
	id := r.timeline.begin(ev)
	return func(what string, pid int) {
		ev.what, ev.pid, ev.to = what, pid, time.Now()
		r.timeline.end(id, ev)
	}
}
