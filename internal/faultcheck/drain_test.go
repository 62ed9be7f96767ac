package faultcheck_test

// The drain: an instance gets SIGTERM while its way to Redis is cut, with
// the store of a handler that has just answered waiting in its background
// queue. It shuts down as example/main.go does (instance.drain): the
// server's Shutdown, then every middleware's Shutdown, under one deadline.
// Redis comes back before that deadline (in a quarter of the drains after
// it), the process exits by itself, and it is started again, as after a
// kill.
//
// The promise (later.go, Shutdown): what a process that was allowed to
// drain holds is not lost. The answer of every handler it ran is stored
// and every release done, so a retry replays the answer and never finds
// the key interrupted nor runs it again; when the deadline ended the
// drain first, only the keys its log names as left undone may end
// interrupted.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"time"
)

const (
	ruleDrainLost        = "a drained process lost an answer or a release that its log does not name as undone"
	ruleDrainRanAgain    = "a key ran again after the process that ran it drained"
	ruleDrainInterrupted = "a retry after a drain found a key of the drained process interrupted"
	ruleDrainNoExit      = "an instance did not exit by itself after SIGTERM"
)

// drainDeadline bounds an instance's drain: longer than a handler of the
// check runs with its store's tries, so that calls end within it.
const drainDeadline = 3 * time.Second

// drainExitBound is how long past its deadline a drained instance may take
// to exit.
const drainExitBound = 15 * time.Second

// drain draws, in some histories, a drain anchored on a slow request: the
// cut begins a little before its handler answers, so that its store meets
// the cut, and lasts dur after the SIGTERM.
func (d drawer) drain(p *plan) []*faultPlan {
	if !d.chance(kindDrain, 0.15) {
		return nil
	}
	var anchors []*requestPlan
	for _, k := range p.keys {
		for _, q := range k.requests() {
			if k.role == "" && q.act == actSlow && !q.impostor {
				anchors = append(anchors, q)
			}
		}
	}
	if len(anchors) == 0 {
		return nil
	}
	q := anchors[d.rng.IntN(len(anchors))]
	f := &faultPlan{kind: kindDrain, anchor: q, instance: q.instance,
		at:  max(q.pause-d.between(0, 40*time.Millisecond), 0),
		dur: d.between(100*time.Millisecond, drainDeadline-500*time.Millisecond)}
	if d.rng.IntN(4) == 0 {
		f.dur = d.between(drainDeadline+300*time.Millisecond, drainDeadline+time.Second)
	}
	return []*faultPlan{f}
}

// drainReport is how a drain went, as the process told it.
type drainReport struct {
	term, exit time.Time // SIGTERM, and the exit (or the kill that ended a drain that did not)
	cutEnd     time.Time // when its way to Redis was open again
	exited     bool      // by itself, within drainExitBound past its deadline
	outcome    string    // "complete", or why the drain ended otherwise
	undone     map[string]bool
	running    bool // calls were still running when the deadline ended it
	// logged is what the process warned of each key, for a broken rule to
	// quote.
	logged map[string][]string
}

// drainAndRestart cuts p off from Redis, lets the anchor's handler answer
// into the cut, sends SIGTERM, opens the way again after f.dur, waits for
// the process to exit by itself, and starts it again. Call with
// p.lifecycle and p.proxyFaults held.
func (r *rig) drainAndRestart(h *history, p *instanceProc, f *faultPlan, ev *faultEvent) string {
	p.proxy.StartBlackhole()
	select {
	case <-h.answered[f.anchor]:
	case <-time.After(clientBound):
	}
	d := &drainReport{term: time.Now()}
	cmd, exited, out := p.signal(syscall.SIGTERM)
	ev.pid, ev.drain = cmd.Process.Pid, d
	time.Sleep(f.dur)
	p.proxy.EndBlackhole()
	d.cutEnd = time.Now()
	select {
	case <-exited:
		d.exited = true
	case <-time.After(time.Until(d.term.Add(p.drain + drainExitBound))):
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	d.exit = time.Now()
	d.read(out.String())
	r.restart(p)
	return fmt.Sprintf("SIGTERM of %s (pid %d) with its Redis cut off; Redis back after %v; the drain: %s, %d keys logged undone; restarted",
		p.name, ev.pid, f.dur, d.outcome, len(d.undone))
}

// read reads what the process printed of its drain: the last line, and
// what its middlewares' Shutdown logged (drainLog).
func (d *drainReport) read(output string) {
	d.undone, d.logged = map[string]bool{}, map[string][]string{}
	d.outcome = "no report"
	lines := bufio.NewScanner(strings.NewReader(output))
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if o, ok := strings.CutPrefix(line, drainedLine); ok {
			d.outcome = o
			continue
		}
		var entry struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			Key   string    `json:"key"`
			Error string    `json:"error"`
			Calls int       `json:"calls"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		if entry.Key != "" {
			d.logged[entry.Key] = append(d.logged[entry.Key], fmt.Sprintf("%s %s %s",
				entry.Time.Format("15:04:05.000"), entry.Msg, entry.Error))
		}
		if !strings.HasPrefix(entry.Msg, shutdownLog) {
			continue
		}
		if entry.Key != "" {
			d.undone[entry.Key] = true
		}
		d.running = d.running || entry.Calls > 0
	}
}

// checkDrains holds the key's executions on each drained process to the
// drain's promise. An execution that owned the key when its process exited
// (no claim after its own) and that answered (its effect applied, an act
// that then answers 201) must be the key's stored answer, and one that
// gave its key up must have freed it; no claim may follow the exit, and no
// request sent after it may find the key interrupted. Excused: a key the
// drain's log names as left undone; an execution whose answer its client
// never got when the drain's deadline ended with calls still running (the
// exit cut it off, as a kill would); and an execution whose record a
// Redis restart may have forgotten (checkRestarts).
func (c *keyCase) checkDrains() {
	for _, f := range c.h.faults {
		if f.kind != kindDrain || f.drain == nil {
			continue
		}
		d := f.drain
		if c.state != nil && d.undone[c.state.Key] {
			continue
		}
		for exec, e := range c.starts {
			if !ranOn(exec, f) || c.forgotten(e.Fence) || (d.running && !c.answeredBy(exec)) {
				continue
			}
			if c.claimedBetween(e.Fence, d.exit) {
				continue // it no longer owned the key at the exit
			}
			c.checkDrained(e, d)
		}
	}
}

// checkDrained holds execution e, which owned its key when its process
// exited after drain d.
func (c *keyCase) checkDrained(e trace, d *drainReport) {
	answered := c.answered(e)
	gaveUp := releasing(e.Act, c.cfg) && !c.hasApplied(e.Exec)
	if !answered && !gaveUp {
		return // kept, or cut off: the key may read interrupted
	}
	if c.cfg.RetryAbandoned && c.takeoverUndone() {
		// A claim that took the key over while the cut lasted, and never
		// ran: its store found the key another's, and the claim's undo
		// handed the key back after.
		return
	}
	c.h.arm(ruleDrainLost)
	switch {
	case answered && !(c.stored() && c.state.Fence == e.Fence):
		c.fail(ruleDrainLost, "the answer of %s, which ran on the drained process, is not the key's: it ends %s (drain: %s)%s",
			c.describe(e.Exec), stateText(c.state), d.outcome, c.drainLogged(d))
	case gaveUp && c.state != nil && c.state.State == "run" && c.state.Fence == e.Fence:
		c.fail(ruleDrainLost, "%s gave the key up on the drained process, yet it stays claimed: %s (drain: %s)%s",
			c.describe(e.Exec), stateText(c.state), d.outcome, c.drainLogged(d))
	}
	if answered {
		c.h.arm(ruleDrainRanAgain)
		for exec, s := range c.starts {
			if claimTime(s.Fence).After(d.exit) && !c.h.restartBetween(e.Fence, s.Fence) {
				c.fail(ruleDrainRanAgain, "%s started after the drain of the process that stored %s had ended",
					c.describe(exec), c.describe(e.Exec))
			}
		}
	}
	for _, x := range c.exchanges {
		if x.sent.After(d.exit) {
			c.h.arm(ruleDrainInterrupted)
		}
		if x.sent.After(d.exit) && read(x).problem == "interrupted" {
			c.fail(ruleDrainInterrupted, "%s, sent after the drain, got interrupted; %s owned the key", x.req.name, c.describe(e.Exec))
		}
	}
}

// drainLogged is what the drained process warned of the key, as a
// sentence to end a failure with.
func (c *keyCase) drainLogged(d *drainReport) string {
	if c.state == nil {
		return ""
	}
	if len(d.logged[c.state.Key]) == 0 {
		return "; the process logged nothing of the key"
	}
	return "; the process logged of the key:\n    " + strings.Join(d.logged[c.state.Key], "\n    ")
}

// answeredBy reports whether the client of exec's request got exec's own
// answer: the call, store tries included, was over.
func (c *keyCase) answeredBy(exec string) bool {
	_, ok := c.ownAnswer(exec)
	return ok
}

// claimedBetween reports whether an execution of the key was claimed after
// the claim at fence and before until.
func (c *keyCase) claimedBetween(fence uint64, until time.Time) bool {
	for _, s := range c.starts {
		if s.Fence > fence && !claimTime(s.Fence).After(until) {
			return true
		}
	}
	return false
}

// claimTime is when a claim was made: its fencing token is Redis's clock,
// in microseconds, at the claim.
func claimTime(fence uint64) time.Time { return time.UnixMicro(int64(fence)) }

// checkDrainExits: a drained instance exits by itself.
func checkDrainExits(h *history) []violation {
	var found []violation
	for _, f := range h.faults {
		if f.kind == kindDrain && f.drain != nil && f.history == h.plan.index {
			h.arm(ruleDrainNoExit)
		}
		if f.kind == kindDrain && f.drain != nil && !f.drain.exited && f.history == h.plan.index {
			found = append(found, violation{ruleDrainNoExit, nil, fmt.Sprintf(
				"instance %s (pid %d) still ran %v after SIGTERM (drain: %s); it was killed", instanceName(f.instance), f.pid,
				f.drain.exit.Sub(f.drain.term).Round(time.Millisecond), f.drain.outcome)})
		}
	}
	return found
}
