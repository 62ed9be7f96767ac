package faultcheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
)

// A history is one plan as it ran: every exchange with the instances, and
// afterwards what the application's database and Redis hold for its keys.
type history struct {
	plan                      *plan
	began, settled, collected time.Time

	sent     map[*requestPlan]chan struct{} // closed once the request is sent
	answered map[*requestPlan]chan struct{} // closed once its exchange is over

	mu        sync.Mutex
	exchanges []*exchange
	injected  map[string]int // faults by kind

	// After the history: whether every request inside the instances
	// finished, and per key what the handlers traced and Redis holds.
	drained bool
	traces  map[*keyPlan][]trace
	states  map[*keyPlan]*admin.KeyState
	// records found in Redis that no traced execution names, by name
	stray map[string]admin.KeyState
	// faults injected while it ran, by any history
	faults []faultEvent
	// what the check excused, and why: counted apart in the report
	notes map[string]int
	// how often each rule's precondition came up: a rule never armed in a
	// run held nothing
	armed map[string]int
	// how long after their key's answer duplicates waiting on the other
	// instance replayed it (checkWaits)
	lags []time.Duration
	// how long duplicates sent to the other instance after their key's
	// answer took to replay it: what a replay costs on this machine now
	// (checkWaits)
	replays []time.Duration
	// keys whose answer may still have been on its way (awaitStores)
	undecided map[*keyPlan]bool
	// the late phase: when its key ring revoked the one that signed the
	// history's tokens (zero: none did), when it read what the token-mode
	// keys' records held, and what
	revoked, lateRead time.Time
	lateStates        map[*keyPlan]*admin.KeyState
}

// note counts something a fault excused.
func (h *history) note(what string) {
	if h.notes == nil {
		h.notes = map[string]int{}
	}
	h.notes[what]++
}

// arm counts one occasion on which rule could have broken.
func (h *history) arm(rule string) {
	if h.armed == nil {
		h.armed = map[string]int{}
	}
	h.armed[rule]++
}

// exchange is one request and what came back.
type exchange struct {
	req        *requestPlan
	instance   string
	sent, done time.Time
	// err is set when no complete answer came: the connection was
	// refused or lost, or the client gave up; status and body then hold
	// whatever did arrive.
	err    error
	status int
	header http.Header
	body   []byte
}

// replayed reports whether the answer says it is a stored one: a replay of
// a route, or Do's result for a duplicate.
func (x *exchange) replayed() bool {
	if x.header == nil {
		return false
	}
	o := x.header.Get(outcomeHeader)
	return x.header.Get(idempotency.ReplayedHeader) == "true" || o == "replayed" || o == "waited"
}

// clientBound bounds every request: the middleware answers within its
// timeouts and the faults end within seconds, so a request that takes
// this long has hung.
const clientBound = 15 * time.Second

// run runs p: each key's chain and extras, and the faults, at their
// moments; then waits for the history to settle and reads its outcome.
func (r *rig) run(p *plan) *history {
	h := &history{plan: p, injected: map[string]int{}, undecided: map[*keyPlan]bool{},
		sent: map[*requestPlan]chan struct{}{}, answered: map[*requestPlan]chan struct{}{}}
	for _, k := range p.keys {
		for _, q := range k.requests() {
			h.sent[q], h.answered[q] = make(chan struct{}), make(chan struct{})
		}
	}
	if p.alone {
		r.lanes.Lock()
		defer r.lanes.Unlock()
	} else {
		r.lanes.RLock()
		defer r.lanes.RUnlock()
	}
	r.issueTokens(p)
	h.began = time.Now()
	var wg sync.WaitGroup
	for _, k := range p.keys {
		wg.Go(func() {
			for i, q := range k.chain {
				if i == 0 {
					sleepUntil(h.began.Add(q.at))
				} else {
					time.Sleep(q.at)
				}
				r.send(h, q)
			}
		})
		for _, q := range k.extras {
			wg.Go(func() {
				sleepUntil(h.began.Add(q.at))
				r.send(h, q)
			})
		}
	}
	for _, f := range p.faults {
		wg.Go(func() {
			if f.anchor != nil {
				<-h.sent[f.anchor]
				time.Sleep(f.at)
			} else {
				sleepUntil(h.began.Add(f.at))
			}
			r.inject(h, f)
		})
	}
	wg.Wait()
	r.settle(h)
	if p.late {
		r.late(h)
		r.settle(h)
	}
	h.faults = r.timeline.between(h.began, h.settled)
	r.collect(h)
	// What Redis holds was read after the history settled: a fault
	// meanwhile (a restart, say) is the history's too.
	h.collected = time.Now()
	h.faults = r.timeline.between(h.began, h.collected)
	return h
}

func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

func (h *history) count(kind string) {
	h.mu.Lock()
	h.injected[kind]++
	h.mu.Unlock()
}

// send makes one request and records the exchange.
func (r *rig) send(h *history, q *requestPlan) {
	h.countRequest(q)
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	switch {
	case q.disconnectAfter > 0:
		var disconnect context.CancelFunc
		ctx, disconnect = context.WithCancel(ctx)
		defer time.AfterFunc(q.disconnectAfter, disconnect).Stop()
	case q.deadline > 0:
		ctx, cancel = context.WithTimeout(ctx, q.deadline)
		defer cancel()
	}
	inst := r.instances[q.instance]
	req := newRequest(ctx, inst.baseURL(), h.plan.cfg, q)
	x := &exchange{req: q, instance: inst.name, sent: time.Now()}
	close(h.sent[q])
	// net/http's Transport resends a request that carries an
	// Idempotency-Key, as it would a GET, when a reused connection closes
	// before any answer: one request of the plan may then reach a handler
	// more than once, as the traces show. That is what a Go client does.
	r.fetch(req, x)
	h.mu.Lock()
	h.exchanges = append(h.exchanges, x)
	h.mu.Unlock()
	close(h.answered[q])
}

// fetch sends req and reads what comes back into x.
func (r *rig) fetch(req *http.Request, x *exchange) {
	resp, err := r.http.Do(req)
	if err == nil {
		x.status, x.header = resp.StatusCode, resp.Header
		x.body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	x.err, x.done = err, time.Now()
}

// newRequest is q as the client sends it: the key, the caller, what the
// handler is to do, and the history's configuration.
func newRequest(ctx context.Context, base string, cfg historyConfig, q *requestPlan) *http.Request {
	body := q.key.body
	if q.impostor {
		body = q.key.otherBody
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+q.key.route, strings.NewReader(body))
	config, _ := json.Marshal(cfg)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(configHeader, string(config))
	req.Header.Set(idempotency.KeyHeader, q.key.value())
	req.Header.Set(clientHeader, q.key.scope)
	req.Header.Set(actHeader, q.act)
	req.Header.Set(pauseHeader, strconv.FormatInt(q.pause.Milliseconds(), 10))
	req.Header.Set(lingerHeader, strconv.FormatInt(q.linger.Milliseconds(), 10))
	if q.deaf {
		req.Header.Set(deafHeader, "1")
	}
	req.Header.Set(requestHeader, q.name)
	return req
}

// countRequest counts the faults a request carries: its act, its route,
// an impostor's body, a client that leaves or has a deadline.
func (h *history) countRequest(q *requestPlan) {
	for _, kind := range []string{q.act, routeKind(q.key.route)} {
		if kind != actNormal && kind != actSlow && kind != "" {
			h.count(kind)
		}
	}
	if q.impostor {
		h.count(kindImpostor)
	}
	switch {
	case q.disconnectAfter > 0:
		h.count(kindDisconnect)
	case q.deadline > 0:
		h.count(kindClientDeadline)
	}
}

// routeKind is the fault kind a route stands for, if any.
func routeKind(route string) string {
	switch route {
	case routeOuterTimeout:
		return kindOuterTimeout
	case routeDeadline:
		return kindDeadline
	case routeDo:
		return kindDo
	}
	return ""
}

// inject applies one fault and undoes it when its time is up, and adds it
// to the timeline with the moments it really began and ended: faults of
// one sort on one target take turns (a SIGCONT would end every SIGSTOP, a
// blackhole's end another's), so a fault may begin later than planned.
func (r *rig) inject(h *history, f *faultPlan) {
	inst := r.instances[f.instance]
	ev := faultEvent{kind: f.kind, instance: f.instance, history: h.plan.index}
	var id int
	begin := func() {
		ev.from = time.Now()
		id = r.timeline.begin(ev)
	}
	switch f.kind {
	case kindRedisStop, kindRedisRestart, kindCrowd:
		if f.kind == kindRedisRestart {
			r.restarts.Lock()
			defer r.restarts.Unlock()
		}
		r.redisFaults.Lock()
		defer r.redisFaults.Unlock()
		ev.instance = -1
		begin()
		switch f.kind {
		case kindRedisStop:
			ev.what = r.stopRedis(f.dur)
		case kindRedisRestart:
			ev.what = r.restartRedis(f.dur, &ev)
		default:
			ev.what = r.crowdUnderMaxclients(h, f)
		}
	case kindDBStall, kindDBRestart:
		r.redisFaults.Lock()
		defer r.redisFaults.Unlock()
		ev.instance = -1
		begin()
		if f.kind == kindDBStall {
			ev.what = r.stallDatabase(f.dur)
		} else {
			ev.what = r.restartDatabase(f.dur)
		}
	case kindBlackhole, kindDelay, kindSaturate:
		inst.proxyFaults.Lock()
		defer inst.proxyFaults.Unlock()
		begin()
		ev.what = inst.slowOrCut(f)
	case kindDropReply:
		begin()
		ev.what = inst.dropReply(f.needle)
	case kindKill:
		inst.lifecycle.Lock()
		defer inst.lifecycle.Unlock()
		begin()
		ev.what = r.killAndRestart(inst, f.dur, &ev)
	case kindPause:
		inst.lifecycle.Lock()
		defer inst.lifecycle.Unlock()
		begin()
		ev.what = inst.pause(f.dur)
	case kindDrain:
		inst.lifecycle.Lock()
		defer inst.lifecycle.Unlock()
		inst.proxyFaults.Lock()
		defer inst.proxyFaults.Unlock()
		begin()
		ev.what = r.drainAndRestart(h, inst, f, &ev)
	}
	ev.to = time.Now()
	r.timeline.end(id, ev)
	h.count(f.kind)
}

// stopRedis stops the Redis of the middleware for d: connections stay
// open, commands go unanswered.
func (r *rig) stopRedis(d time.Duration) string {
	if err := r.store.Signal(syscall.SIGSTOP); err != nil {
		r.fail("SIGSTOP of Redis: %v", err)
	}
	time.Sleep(d)
	if err := r.store.Signal(syscall.SIGCONT); err != nil {
		r.fail("SIGCONT of Redis: %v", err)
	}
	return fmt.Sprintf("Redis SIGSTOP for %v", d)
}

// slowOrCut delays, or blackholes, the instance's way to Redis for a
// while (a saturation's outage is a blackhole).
func (p *instanceProc) slowOrCut(f *faultPlan) string {
	if f.kind == kindDelay {
		p.proxy.SetDelay(f.delay)
		time.Sleep(f.dur)
		p.proxy.SetDelay(0)
		return fmt.Sprintf("every reply of the store to %s late by %v, for %v", p.name, f.delay, f.dur)
	}
	p.proxy.StartBlackhole()
	time.Sleep(f.dur)
	p.proxy.EndBlackhole()
	return fmt.Sprintf("%s: every byte between %s and its store lost for %v", f.kind, p.name, f.dur)
}

// dropReply loses the reply to the instance's next command that contains
// needle.
func (p *instanceProc) dropReply(needle string) string {
	p.proxy.DropNextReply(needle)
	what := "the next command"
	if needle != "" {
		what = "the next " + needle
	}
	return fmt.Sprintf("the store's reply to %s of %s lost", p.name, what)
}

// killAndRestart kills the instance and starts it again after down.
// pause stops the instance's process for d (SIGSTOP), as a GC pause, a
// frozen VM or a debugger do, and lets it go on (SIGCONT): its timers fire
// late, and its key may have been taken over meanwhile.
func (p *instanceProc) pause(d time.Duration) string {
	p.mu.Lock()
	proc := p.cmd.Process
	p.mu.Unlock()
	proc.Signal(syscall.SIGSTOP)
	time.Sleep(d)
	proc.Signal(syscall.SIGCONT)
	return fmt.Sprintf("SIGSTOP of %s (pid %d) for %v", p.name, proc.Pid, d.Round(time.Millisecond))
}

func (r *rig) killAndRestart(p *instanceProc, down time.Duration, ev *faultEvent) string {
	began := time.Now()
	ev.pid = p.kill()
	time.Sleep(down)
	r.restart(p)
	return fmt.Sprintf("SIGKILL of %s (pid %d); restarted after %v", p.name, ev.pid, time.Since(began).Round(time.Millisecond))
}

func (r *rig) restart(p *instanceProc) {
	if err := p.start(); err != nil {
		r.fail("restarting instance %s: %v", p.name, err)
	}
}

// drainBound bounds how long requests may still run inside the instances
// once every client has its answer or gave up: a handler runs on after
// that, but within the execution timeout and the faults' few seconds.
const drainBound = 20 * time.Second

// settle waits until nothing of the history can still change: no request
// left inside an instance, every lock let go or run out, and one lease
// more for the releases and undos that go on in the background.
//
// A request whose client left may still be on its way into an instance
// (read from its connection, not yet at a handler: on a busy machine that
// takes a while), and start its execution after the instances looked
// drained. So the history is settled only once the instances stayed
// drained over the last lease's wait as well.
func (r *rig) settle(h *history) {
	cfg := h.plan.cfg
	deadline := time.Now().Add(drainBound)
	for {
		for !r.drained(cfg.Prefix) {
			if time.Now().After(deadline) {
				h.settled = time.Now()
				return // h.drained stays false: a finding of its own
			}
			time.Sleep(50 * time.Millisecond)
		}
		h.drained = true
		locks := time.Now().Add(3*cfg.Lease + time.Second)
		for r.locked(cfg.Prefix) && time.Now().Before(locks) {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(cfg.Lease)
		if r.drained(cfg.Prefix) && !r.locked(cfg.Prefix) || time.Now().After(deadline) {
			break
		}
	}
	h.settled = time.Now()
}

// drained reports whether no request of the history is inside an instance.
func (r *rig) drained(prefix string) bool {
	for _, p := range r.instances {
		if n, ok := r.inflight(p, prefix); !ok || n > 0 {
			return false
		}
	}
	return true
}

// locked reports whether some key of the prefix holds its lock.
func (r *rig) locked(prefix string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, err := r.keys.locked(ctx, prefix)
	return err != nil || held
}

// collect reads what the handlers traced for each key, and what Redis
// holds for it, through the operator (admin.Operator.Inspect) of a
// Middleware of the history's prefix.
func (r *rig) collect(h *history) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := h.plan.cfg
	m := r.operator(cfg)
	h.traces = map[*keyPlan][]trace{}
	h.states = map[*keyPlan]*admin.KeyState{}
	named := map[string]bool{}
	for _, k := range h.plan.keys {
		lines, err := r.effectsDB.LRange(ctx, traceKey(cfg.Prefix, k.scope, k.value()), 0, -1).Result()
		if err != nil {
			r.fail("reading the traces of %v: %v", k, err)
			return
		}
		for _, l := range lines {
			var tr trace
			if err := json.Unmarshal([]byte(l), &tr); err != nil {
				r.fail("a trace of %v: %v", k, err)
				return
			}
			h.traces[k] = append(h.traces[k], tr)
			if tr.Record != "" && h.states[k] == nil {
				st, err := m.Inspect(ctx, tr.Record)
				if err != nil {
					r.fail("inspecting %s: %v", tr.Record, err)
					return
				}
				h.states[k] = &st
				named[tr.Record] = true
			}
		}
	}
	if err := r.awaitStores(ctx, h, m); err != nil {
		r.fail("inspecting: %v", err)
		return
	}
	h.stray = map[string]admin.KeyState{}
	names, err := r.keys.records(ctx, cfg.Prefix)
	if err != nil {
		r.fail("listing records: %v", err)
		return
	}
	for _, name := range names {
		if named[name] {
			continue
		}
		st, err := m.Inspect(ctx, name)
		if err != nil {
			r.fail("inspecting %s: %v", name, err)
			return
		}
		h.stray[name] = st
	}
}

// operator reads the keys of a history's prefix.
func (r *rig) operator(cfg historyConfig) *admin.Operator {
	return r.keys.operator(cfg.Prefix)
}

// recordOf is the name of k's record, from the traces of its executions;
// "" when none ran.
func (r *rig) recordOf(ctx context.Context, h *history, k *keyPlan) (string, error) {
	lines, err := r.effectsDB.LRange(ctx, traceKey(h.plan.cfg.Prefix, k.scope, k.value()), 0, -1).Result()
	if err != nil {
		return "", err
	}
	for _, l := range lines {
		var tr trace
		if json.Unmarshal([]byte(l), &tr) == nil && tr.Record != "" {
			return tr.Record, nil
		}
	}
	return "", nil
}

// forget deletes what the history left in the application's database; its
// records in Redis expire with their TTL.
func (r *rig) forget(h *history) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range h.plan.keys {
		cfg := h.plan.cfg
		r.effectsDB.Del(ctx, traceKey(cfg.Prefix, k.scope, k.value()), fenceKey(cfg.Prefix, k.scope, k.value()))
	}
}

// story tells what happened to key k (every key, when k is nil) in time
// order: its requests and answers, what its executions traced, the faults
// around them, and where it ended.
func (h *history) story(k *keyPlan) []string {
	type line struct {
		at   time.Time
		text string
		name string // the request's, for the lines of an exchange
	}
	var lines []line
	for _, x := range h.exchanges {
		if k != nil && x.req.key != k {
			continue
		}
		lines = append(lines,
			line{x.sent, fmt.Sprintf("%s  %s → %s", x.instance, x.req, x.req.key), x.req.name},
			line{x.done, fmt.Sprintf("%s  %s ← %s", x.instance, x.req.name, replyText(x)), x.req.name})
	}
	for _, key := range h.plan.keys {
		if k != nil && key != k {
			continue
		}
		for _, tr := range h.traces[key] {
			lines = append(lines, line{at: time.Unix(0, tr.At), text: tr.Instance + "  " + traceText(tr)})
		}
	}
	if len(lines) == 0 {
		lines = append(lines, line{at: h.began, text: "(no request)"})
	}
	first, last := lines[0].at, lines[0].at
	for _, l := range lines {
		first, last = minTime(first, l.at), maxTime(last, l.at)
	}
	for _, f := range h.faults {
		if !f.to.Before(first.Add(-200*time.Millisecond)) && !f.from.After(last.Add(200*time.Millisecond)) {
			until := fmt.Sprintf("until %+.3fs", f.to.Sub(h.began).Seconds())
			if f.ongoing {
				until = "still going on"
			}
			what := f.what
			if what == "" {
				what = f.kind
			}
			lines = append(lines, line{at: f.from, text: fmt.Sprintf("*  %s (%s)", what, until)})
		}
	}
	for _, key := range h.plan.keys {
		if k == nil || key == k {
			text := fmt.Sprintf("=  %s ends: %s", key, stateText(h.states[key]))
			lines = append(lines, line{at: h.collected, text: text})
		}
	}
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	// Lines in a row that differ only in their request's name (hundreds of
	// duplicates of one key) are told once.
	var out []string
	for i := 0; i < len(lines); {
		l, names := lines[i], []string{lines[i].name}
		for i++; l.name != "" && i < len(lines) && lines[i].name != "" &&
			strings.Replace(lines[i].text, lines[i].name, "", 1) == strings.Replace(l.text, l.name, "", 1); i++ {
			names = append(names, lines[i].name)
		}
		text := l.text
		if len(names) > 1 {
			text = strings.Replace(text, l.name, fmt.Sprintf("%s … %s (%d requests)", l.name, names[len(names)-1], len(names)), 1)
		}
		out = append(out, fmt.Sprintf("%+8.3fs  %s", l.at.Sub(h.began).Seconds(), text))
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// replyText sums up an answer for a story.
func replyText(x *exchange) string {
	if x.err != nil {
		s := "no answer: " + x.err.Error()
		if x.status != 0 {
			s = fmt.Sprintf("%d, then %s", x.status, s)
		}
		return s
	}
	s := strconv.Itoa(x.status)
	if x.replayed() {
		s += " (replayed)"
	}
	body := string(x.body)
	if len(body) > 200 {
		body = body[:200] + "…"
	}
	return fmt.Sprintf("%s %s", s, body)
}

// traceText tells what an execution traced.
func traceText(tr trace) string {
	switch tr.Kind {
	case traceStart:
		return fmt.Sprintf("execution %s starts for %s, act %s, token %d", tr.Exec, tr.Request, tr.Act, tr.Fence)
	case traceEffect:
		return fmt.Sprintf("execution %s: EFFECT applied (token %d)", tr.Exec, tr.Fence)
	case traceFencedOut:
		return fmt.Sprintf("execution %s: effect refused, token %d is below the key's highest", tr.Exec, tr.Fence)
	case traceCancelled:
		return fmt.Sprintf("execution %s: its context ended (%s)", tr.Exec, tr.Cause)
	}
	return fmt.Sprintf("execution %s: %s", tr.Exec, tr.Kind)
}
