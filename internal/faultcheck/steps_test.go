package faultcheck_test

// The steps workload of the fault check: resumable runs (WithResume) whose
// handlers take one to four steps (idempotency.Step), each an effect in the
// application's database keyed by its StepKey, as a payment provider keys
// a charge by its Idempotency-Key. Instances are killed or paused (SIGSTOP,
// then SIGCONT: their timers fire late) between and inside steps, the store
// stalls, replies are lost and clients give up at step boundaries, and
// steps outlast the execution timeout; each key's client retries until it
// gets its 201.
// The rules (stepsrule_test.go): no step's effect happens twice
// for a key (a call repeated with the same step key counts once), a step
// journaled by one run never runs again (in a run that resumed it, nor in
// a paused run that continues), no retry is answered interrupted, no
// answer claims less than what took effect ("not executed" after a step's
// effect), every key reaches its answer, and every answer is built from
// the steps' results as their effects gave them.
//
//	go test -race -count=1 -run '^TestFaultCheckSteps$' -v ./internal/faultcheck
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheckSteps$' -v -idem.seed=42 -idem.from=17 -idem.histories=1

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/redis/go-redis/v9"
)

const (
	routeSteps  = "/steps"
	stepsHeader = "X-Fc-Steps" // the steps' pauses, in milliseconds, comma-separated
	// releaseHeader "1": the run gives its key up after its first step, as
	// a handler that finds the request invalid after a charge does
	releaseHeader = "X-Fc-Release-After-Step"
	// stepsBound is how long a key's client retries before the key counts
	// as never answered: a dead run is resumed within the claim horizon
	// (at most about 4 s here), and the faults end within seconds.
	stepsBound = 25 * time.Second
	// stepGap is the handler's own work after each step: an instance
	// paused there is paused between two steps.
	stepGap = 80 * time.Millisecond
)

// What a run of the steps route traces, next to the effects.
const (
	stepRun       = "step-run"       // a step's function begins
	stepEffect    = "step-effect"    // its effect, applied or found (Value)
	stepJournaled = "step-journaled" // Step returned the function's result: it is in the journal
	stepStart     = "start"          // the handler begins
)

// stepTrace is one line of a steps key's server-side log.
type stepTrace struct {
	Kind     string `json:"k"`
	Exec     string `json:"x"`
	Fence    uint64 `json:"f"`
	Step     string `json:"s,omitempty"`
	StepKey  string `json:"sk,omitempty"`
	Value    string `json:"v,omitempty"`
	New      bool   `json:"n,omitempty"` // the effect was applied now, not found
	Request  string `json:"q,omitempty"`
	Record   string `json:"r,omitempty"` // of a start: the key's record (Execution.Key)
	Instance string `json:"i"`
	At       int64  `json:"t"`
}

// stepsAnswer is the steps route's 201: the results of its steps.
type stepsAnswer struct {
	Scope   string   `json:"scope"`
	Key     string   `json:"key"`
	Exec    string   `json:"exec"`
	Results []string `json:"results"`
}

func stepsTraceKey(prefix, scope, key string) string {
	return "fc:" + prefix + ":" + scope + ":" + key + ":steps"
}

// stepEffectScript applies a step's effect once per step key, as a provider
// honours its own idempotency key: the first call's value stands, and a
// repeat gets it back.
// KEYS[1] the effect, by step key; ARGV[1] the value of a first call.
var stepEffectScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  return {v, 0}
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', 600)
return {ARGV[1], 1}
`)

// stepsHandler is the history's resumable route, made on its first
// request (histories of the other workloads never make it). Its policy
// releases (and, once a step is journaled, keeps) a 503, so that a failed
// step is resumed rather than its failure stored.
func (s *instance) stepsHandler(cfg historyConfig) http.Handler {
	protected := sync.OnceValue(func() http.Handler {
		m := s.newMiddleware(cfg, idempotency.WithResume(), idempotency.WithStorePolicy(idempotency.StoreNoTransient))
		return m.ProtectKey(http.HandlerFunc(s.handleSteps))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { protected().ServeHTTP(w, r) })
}

func (s *instance) handleSteps(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var cfg historyConfig
	json.Unmarshal([]byte(r.Header.Get(configHeader)), &cfg)
	e, _ := idempotency.ExecutionOf(ctx)
	x := &stepsRun{s: s, prefix: cfg.Prefix, scope: r.Header.Get(clientHeader), key: r.Header.Get(idempotency.KeyHeader),
		exec: fmt.Sprintf("%s%d.%d", s.spec.Name, s.pid, s.runs.Add(1)), fence: e.Fence,
		deaf: r.Header.Get(deafHeader) == "1"}
	x.trace(stepTrace{Kind: stepStart, Request: r.Header.Get(requestHeader), Record: e.Key})
	a := stepsAnswer{Scope: x.scope, Key: x.key, Exec: x.exec}
	for i, ms := range strings.Split(r.Header.Get(stepsHeader), ",") {
		name := fmt.Sprint("s", i)
		ran := false
		v, err := idempotency.Step(ctx, name, func(ctx context.Context) (string, error) {
			ran = true
			return x.step(ctx, name, millis(ms))
		})
		if err != nil {
			writeSteps(w, http.StatusServiceUnavailable, a) // released, or kept for a retry to resume
			return
		}
		if ran {
			x.trace(stepTrace{Kind: stepJournaled, Step: name, Value: v})
		}
		if i == 0 && r.Header.Get(releaseHeader) == "1" {
			// Release after a journaled step: the run is kept, not
			// released, and the retry resumes it (Release reports false).
			idempotency.Release(ctx)
			b, _ := json.Marshal(a)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(deliberateHeader, "released")
			w.WriteHeader(http.StatusUnprocessableEntity)
			w.Write(b)
			return
		}
		a.Results = append(a.Results, v)
		time.Sleep(stepGap) // the handler's own work between two calls, which heeds no context
	}
	writeSteps(w, http.StatusCreated, a)
}

func writeSteps(w http.ResponseWriter, status int, a stepsAnswer) {
	b, _ := json.Marshal(a)
	w.Header().Set("Content-Type", "application/json")
	if status != http.StatusCreated {
		w.Header().Set(deliberateHeader, "step-failed")
	}
	w.WriteHeader(status)
	w.Write(b)
}

// stepsRun is one execution of the steps route.
type stepsRun struct {
	s                        *instance
	prefix, scope, key, exec string
	fence                    uint64
	deaf                     bool
}

// step pauses (the call's latency), then applies the step's effect under
// its step key, and returns the effect's value.
func (x *stepsRun) step(ctx context.Context, name string, pause time.Duration) (string, error) {
	sk := idempotency.StepKey(ctx, name)
	x.trace(stepTrace{Kind: stepRun, Step: name, StepKey: sk})
	if !x.deaf {
		timer := time.NewTimer(pause)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	} else {
		time.Sleep(pause)
	}
	res, err := stepEffectScript.Run(context.Background(), x.s.effects, []string{"fc:" + x.prefix + ":effect:" + sk},
		x.exec+"/"+name).Slice()
	if err != nil || len(res) != 2 {
		panic(fmt.Sprintf("faultcheck instance %s: a step's effect failed: %v", x.s.spec.Name, err))
	}
	v, _ := res[0].(string)
	x.trace(stepTrace{Kind: stepEffect, Step: name, StepKey: sk, Value: v, New: res[1] == int64(1)})
	return v, nil
}

func (x *stepsRun) trace(tr stepTrace) {
	tr.Exec, tr.Fence, tr.Instance, tr.At = x.exec, x.fence, x.s.spec.Name, time.Now().UnixNano()
	b, _ := json.Marshal(tr)
	if err := x.s.effects.RPush(context.Background(), stepsTraceKey(x.prefix, x.scope, x.key), b).Err(); err != nil {
		panic(fmt.Sprintf("faultcheck instance %s: tracing failed: %v", x.s.spec.Name, err))
	}
}

// stepsPlan is one history of the steps workload.
type stepsPlan struct {
	index  int
	cfg    historyConfig
	keys   []*stepsKey
	faults []*stepsFault
}

// stepsKey is one key: its caller, its steps, and its first request's
// instance and start. Retries follow until the key is answered.
type stepsKey struct {
	scope, id string
	pauses    []time.Duration
	deaf      bool // the steps ignore their context
	// release: the first request's run gives its key up after its first step
	release  bool
	start    time.Duration
	instance int
	// giveUp: the first request's client leaves after this long (0: it
	// waits for its answer).
	giveUp time.Duration
}

func (k *stepsKey) String() string { return k.scope + "/" + k.id }

// boundary is how long after its request a run of k reaches the end of
// step i (i = 0: the start of the first step).
func (k *stepsKey) boundary(i int) time.Duration {
	var d time.Duration
	for _, p := range k.pauses[:i] {
		d += p + stepGap
	}
	return d
}

// stepsFault is a fault aimed at a step boundary of a key's first request.
type stepsFault struct {
	fault  *faultPlan
	key    *stepsKey
	bound  int // the boundary aimed at
	jitter time.Duration
}

// stepsFaultKinds are the kinds of fault the steps workload draws on
// Redis; stepsSQLKinds those on an SQL database of kind.
var stepsFaultKinds = []string{kindKill, kindRedisStop, kindBlackhole, kindDropReply, kindPause, kindLostTakeovers}

func stepsSQLKinds(kind sqltest.Kind) []string {
	kinds := []string{kindKill, kindDBStall, kindPause}
	if kind != sqltest.SQLite { // a file has no connection to fault
		kinds = append(kinds, kindBlackhole, kindDropReply, kindDBRestart)
	}
	return kinds
}

// stepsKinds is the kinds of fault the steps workload draws, of those
// known on its store: as TestFaultCheck's, those -idem.faults names (or
// all), less those -idem.skip names.
func stepsKinds(t *testing.T, known []string) []string {
	kinds, err := parseKinds(*flagFaults, *flagSkip, known)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(slices.Clone(known), func(k string) bool { return !kinds[k] })
}

func newStepsPlan(seed uint64, index int, kinds []string, onSQL bool) *stepsPlan {
	rng := rand.New(rand.NewPCG(seed, uint64(index)|1<<62))
	p := &stepsPlan{index: index, cfg: drawConfig(rng, fmt.Sprintf("fs%xh%d", seed&0xffffff, index))}
	p.cfg.NoTransient = true
	if rng.IntN(2) == 0 {
		// An execution timeout well past the lease, under
		// WithRetryAbandoned: a paused executor's key is taken over long
		// before anything in its process cuts its run off.
		p.cfg.ExecTimeout, p.cfg.RetryAbandoned = 3*p.cfg.Lease, true
	}
	d := drawer{rng: rng}
	ms := time.Millisecond
	for i := range 1 + rng.IntN(3) {
		k := &stepsKey{scope: scopes[rng.IntN(len(scopes))], id: fmt.Sprint("s", i), instance: rng.IntN(2),
			start: d.between(0, 300*ms), deaf: rng.IntN(4) == 0}
		for range 1 + rng.IntN(4) {
			pause := d.between(20*ms, 250*ms)
			if rng.IntN(8) == 0 {
				// The first run's call outlasts the execution timeout, which
				// cuts it off.
				pause = d.between(p.cfg.ExecTimeout, p.cfg.ExecTimeout+400*ms)
			}
			k.pauses = append(k.pauses, pause)
		}
		if rng.IntN(4) == 0 {
			// The client's own deadline, at a step boundary.
			k.giveUp = k.boundary(rng.IntN(len(k.pauses)+1)) + d.between(5*ms, 40*ms)
		}
		k.release = rng.IntN(6) == 0
		p.keys = append(p.keys, k)
	}
	for range 1 + rng.IntN(3) {
		if len(kinds) == 0 {
			break
		}
		k := p.keys[rng.IntN(len(p.keys))]
		f := &faultPlan{kind: kinds[rng.IntN(len(kinds))], instance: k.instance}
		jitter, bound := d.between(0, 30*ms), rng.IntN(len(k.pauses)+1)
		switch f.kind {
		case kindRedisStop, kindBlackhole, kindDBStall:
			f.dur = d.between(100*ms, 1200*ms)
		case kindDropReply:
			f.needle = "evalsha" // a journal write, a claim or a store
			if onSQL {
				// A journal write's COMMIT, a claim's or a store's
				// statement: done, and its reply lost.
				f.needle = []string{"", "commit"}[rng.IntN(2)]
			}
		case kindDBRestart:
			if rng.IntN(2) == 0 {
				f.dur = d.between(100*ms, 1200*ms)
			}
		case kindKill:
			f.dur = d.between(50*ms, 300*ms)
		case kindLostTakeovers:
			// After a journaled step, in runs taken over once their lease
			// lapsed; one chain a history.
			if slices.ContainsFunc(p.faults, func(sf *stepsFault) bool { return sf.fault.kind == kindLostTakeovers }) {
				continue
			}
			f.dur, bound = d.between(50*ms, 300*ms), 1+rng.IntN(len(k.pauses))
			p.cfg.RetryAbandoned = true
		case kindPause:
			// After a step: in the handler's gap before the next one, or
			// into the next one.
			f.dur, bound = p.pauseLength(d), 1+rng.IntN(len(k.pauses))
			jitter = d.between(0, stepGap)
			if rng.IntN(2) == 0 {
				jitter = d.between(stepGap, stepGap+200*ms)
			}
			jitter -= stepGap
		}
		p.faults = append(p.faults, &stepsFault{fault: f, key: k, bound: bound, jitter: jitter})
	}
	return p
}

// pauseLength draws how long an instance is paused: within its lease;
// past its lease but within its execution timeout, so that its key is
// taken over (WithRetryAbandoned) while nothing in the process has cut its
// run off yet; or past the claim horizon, after which WithResume alone
// takes the key over too.
func (p *stepsPlan) pauseLength(d drawer) time.Duration {
	c, ms := p.cfg, time.Millisecond
	horizon := c.ExecTimeout + c.Lease + 4*c.StoreTimeout + 100*ms
	switch d.rng.IntN(3) {
	case 0:
		return d.between(100*ms, c.Lease)
	case 1:
		return d.between(c.Lease+100*ms, max(c.ExecTimeout, c.Lease+200*ms))
	}
	return d.between(horizon+200*ms, horizon+1500*ms)
}

// stepsExchange is one request of a steps key and its answer.
type stepsExchange struct {
	exchange
	key  *stepsKey
	name string
}

// stepsHistory is a steps plan as it ran.
type stepsHistory struct {
	plan      *stepsPlan
	run       *history // the rig's view of it: its settling and fault timeline
	mu        sync.Mutex
	exchanges []*stepsExchange
	traces    map[*stepsKey][]stepTrace
	states    map[*stepsKey]string            // the record's state at the end ("" for none)
	records   map[*stepsKey]string            // the record's Redis key
	effects   map[*stepsKey]map[string]string // each step key's effect, as the database holds it
	// undecided are the keys whose store from the background had not
	// landed when the check gave up waiting for their instance to be
	// quiet; claimedForGood those whose 201's process was killed after
	// it answered, before its store landed.
	undecided, claimedForGood map[*stepsKey]bool
}

// runSteps runs p: each key's first request (and the faults aimed at its
// step boundaries), then retries every 100 to 300 ms until it is answered.
func (r *rig) runSteps(p *stepsPlan) *stepsHistory {
	h := &stepsHistory{plan: p, run: &history{plan: &plan{index: p.index, cfg: p.cfg}, began: time.Now(),
		injected: map[string]int{}}}
	sent := map[*stepsKey]chan struct{}{}
	for _, k := range p.keys {
		sent[k] = make(chan struct{})
	}
	var wg sync.WaitGroup
	var n atomic.Int64
	for _, k := range p.keys {
		wg.Go(func() {
			sleepUntil(h.run.began.Add(k.start))
			jitter := rand.New(rand.NewPCG(uint64(p.index), uint64(k.start)))
			first, deadline := true, time.Now().Add(stepsBound)
			for {
				inst := k.instance
				if !first {
					inst = jitter.IntN(2)
				}
				x := r.sendStep(h, k, inst, fmt.Sprintf("#%d", n.Add(1)), first, sent)
				first = false
				if x.err == nil && x.status == http.StatusCreated || time.Now().After(deadline) {
					return
				}
				time.Sleep(time.Duration(100+jitter.IntN(200)) * time.Millisecond)
			}
		})
	}
	for _, f := range p.faults {
		wg.Go(func() {
			<-sent[f.key]
			time.Sleep(f.key.boundary(f.bound) + f.jitter)
			if f.fault.kind == kindPause {
				// The key's first request hangs on the paused instance; its
				// caller retries on the other meanwhile, which may take the
				// key over.
				paused := make(chan struct{})
				defer close(paused)
				wg.Go(func() {
					for {
						select {
						case <-paused:
							return
						case <-time.After(time.Duration(100+rand.IntN(200)) * time.Millisecond):
						}
						r.sendStep(h, f.key, 1-f.fault.instance, fmt.Sprintf("#%d", n.Add(1)), false, sent)
					}
				})
			}
			if f.fault.kind == kindLostTakeovers {
				r.loseTakeovers(h, f.key, f.fault) // a kill and blackholes, each on the timeline
				h.run.count(kindLostTakeovers)
				return
			}
			r.inject(h.run, f.fault)
		})
	}
	wg.Wait()
	r.settle(h.run)
	h.run.faults = r.timeline.between(h.run.began, h.run.settled)
	r.collectSteps(h)
	return h
}

// sendStep makes one request of key k to instance inst.
func (r *rig) sendStep(h *stepsHistory, k *stepsKey, inst int, name string, first bool, sent map[*stepsKey]chan struct{}) *stepsExchange {
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	if first && k.giveUp > 0 {
		ctx, cancel = context.WithTimeout(ctx, k.giveUp)
		defer cancel()
	}
	p := r.instances[inst]
	body := fmt.Sprintf(`{"steps":"%s/%s"}`, k.scope, k.id)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.baseURL()+routeSteps, strings.NewReader(body))
	config, _ := json.Marshal(h.plan.cfg)
	pauses := make([]string, len(k.pauses))
	for i, d := range k.pauses {
		if !first {
			// Only the first run's calls are slow past the execution
			// timeout: a step that always is could never be answered.
			d = min(d, 250*time.Millisecond)
		}
		pauses[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(configHeader, string(config))
	req.Header.Set(idempotency.KeyHeader, k.id)
	req.Header.Set(clientHeader, k.scope)
	req.Header.Set(stepsHeader, strings.Join(pauses, ","))
	req.Header.Set(requestHeader, name)
	if k.deaf {
		req.Header.Set(deafHeader, "1")
	}
	if first && k.release {
		req.Header.Set(releaseHeader, "1")
	}
	x := &stepsExchange{exchange: exchange{instance: p.name, sent: time.Now()}, key: k, name: name}
	if first {
		close(sent[k])
	}
	r.fetch(req, &x.exchange)
	h.mu.Lock()
	h.exchanges = append(h.exchanges, x)
	h.mu.Unlock()
	return x
}

// collectSteps reads each key's traces, its steps' effects and its
// record's state, then deletes the traces.
func (r *rig) collectSteps(h *stepsHistory) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := h.plan.cfg.Prefix
	h.traces, h.states, h.effects = map[*stepsKey][]stepTrace{}, map[*stepsKey]string{}, map[*stepsKey]map[string]string{}
	h.records, h.undecided, h.claimedForGood = map[*stepsKey]string{}, map[*stepsKey]bool{}, map[*stepsKey]bool{}
	for _, k := range h.plan.keys {
		lines, err := r.effectsDB.LRange(ctx, stepsTraceKey(prefix, k.scope, k.id), 0, -1).Result()
		if err != nil {
			r.fail("reading the traces of %v: %v", k, err)
			return
		}
		h.effects[k] = map[string]string{}
		for _, l := range lines {
			var tr stepTrace
			if err := json.Unmarshal([]byte(l), &tr); err != nil {
				r.fail("a trace of %v: %v", k, err)
				return
			}
			h.traces[k] = append(h.traces[k], tr)
			switch {
			case tr.Kind == stepRun:
				h.effects[k][tr.StepKey] = r.effectsDB.Get(ctx, "fc:"+prefix+":effect:"+tr.StepKey).Val()
			case tr.Kind == stepStart && h.states[k] == "":
				h.records[k] = tr.Record
				h.states[k] = r.recordState(ctx, tr.Record)
			}
		}
		r.effectsDB.Del(ctx, stepsTraceKey(prefix, k.scope, k.id))
		r.awaitStepsStore(ctx, h, k)
	}
}

// recordState is the state a record's text begins with ("" for none).
func (r *rig) recordState(ctx context.Context, record string) string {
	text, _ := r.keys.record(ctx, record)
	state, _, _ := strings.Cut(text, " ")
	return state
}

// awaitStepsStore gives the answer of a run that answered 201 on a process
// that lives on the time to land from its background queue, which the
// history's settling does not wait for (as awaitStores does for the key
// workload): the record reads "run" until then. It waits until the
// instance has been free of faults for storeQuiet, for awaitStoresBound
// at most; a key still waiting then is left undecided. A run whose process
// was killed after its 201 leaves the key claimed for good, and the next
// retry resumes it from the journal: that key reads "run" by right.
func (r *rig) awaitStepsStore(ctx context.Context, h *stepsHistory, k *stepsKey) {
	if h.states[k] != "run" {
		return
	}
	exec, inst := "", ""
	for _, x := range h.exchanges {
		var a stepsAnswer
		if x.key == k && x.err == nil && x.status == http.StatusCreated && json.Unmarshal(x.body, &a) == nil {
			exec, inst = a.Exec, x.instance
		}
	}
	if exec == "" {
		return // no 201: nothing of the key waits to be stored
	}
	if h.run.ended(exec) {
		h.claimedForGood[k] = true
		return
	}
	deadline := time.Now().Add(awaitStoresBound)
	for h.states[k] == "run" && !r.quiet(instanceIndex(inst), storeQuiet) {
		if time.Now().After(deadline) {
			h.undecided[k] = true
			return
		}
		time.Sleep(100 * time.Millisecond)
		h.states[k] = r.recordState(ctx, h.records[k])
	}
	h.states[k] = r.recordState(ctx, h.records[k])
}

func TestFaultCheckSteps(t *testing.T) {
	runStepsCheck(t, stepsKinds(t, stepsFaultKinds), boundedRun, newRig(t))
}

// TestFaultCheckStepsSQL runs the steps workload on the SQL store: SQLite
// always, PostgreSQL and MySQL/MariaDB when POSTGRES_DSN and MYSQL_DSN name
// a server. Redis's faults become the database's, as in TestFaultCheckSQL:
// the keys table locked (db-stall), every connection dropped (db-restart),
// the reply to a journal write's COMMIT, a claim or a store lost.
//
//	go test -race -count=1 -run '^TestFaultCheckStepsSQL$' -v ./internal/faultcheck
func TestFaultCheckStepsSQL(t *testing.T) {
	for _, kind := range []sqltest.Kind{sqltest.SQLite, sqltest.PostgreSQL, sqltest.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			runStepsCheck(t, stepsKinds(t, stepsSQLKinds(kind)), boundedStepsSQLRun, newSQLRig(t, sqltest.Open(t, kind)))
		})
	}
}

// boundedStepsSQLRun is how long a plain `go test` starts steps histories
// on each SQL database, and waits for their keys (stepsBound) after that.
const boundedStepsSQLRun = stepsBound + 10*time.Second

// runStepsCheck runs steps histories drawing faults of kinds on r, for
// bounded unless the flags say otherwise, and reports what broke.
func runStepsCheck(t *testing.T, kinds []string, bounded time.Duration, r *rig) {
	seed, limit := runBounds(bounded)
	t.Logf("steps fault check: seed %d, fault kinds %s (the same run again: -idem.seed=%d)", seed, strings.Join(kinds, ","), seed)
	onSQL := r.store == nil
	began := time.Now()
	var mu sync.Mutex
	histories, answers, broken, did := 0, map[string]int{}, map[string]int{}, map[string]int{}
	var next atomic.Int64
	next.Store(int64(*flagFrom))
	var lanes sync.WaitGroup
	for range max(*flagLanes, 1) {
		lanes.Go(func() {
			for !r.broken.Load() {
				i := int(next.Add(1) - 1)
				if *flagHistories > 0 && i >= *flagFrom+*flagHistories {
					return
				}
				if limit > 0 && time.Since(began) > limit-stepsBound {
					return
				}
				if mu.Lock(); *flagFirst && len(broken) > 0 {
					mu.Unlock()
					return
				}
				mu.Unlock()
				h := r.runSteps(newStepsPlan(seed, i, kinds, onSQL))
				if r.broken.Load() {
					return
				}
				found := checkSteps(h)
				mu.Lock()
				histories++
				for _, x := range h.exchanges {
					answers[stepsLabel(x)]++
				}
				tallySteps(h, did)
				for _, v := range found {
					broken[v.rule]++
					if broken[v.rule] <= max(*flagStories, 1) {
						t.Errorf("RULE BROKEN: %s; history %d, key %s:\n  %s\n  config: %s\n%s\n  replay: "+
							"go test -race -count=1 ./internal/faultcheck -run '^%s$' -v -idem.seed=%d -idem.from=%d -idem.histories=1",
							v.rule, i, v.key, v.detail, h.plan.cfg, indent(h.story(v.key)), t.Name(), seed, i)
					}
				}
				mu.Unlock()
			}
		})
	}
	lanes.Wait()
	t.Logf("steps fault check: %d histories in %v", histories, time.Since(began).Round(time.Second))
	if histories == 0 && !r.broken.Load() {
		t.Errorf("no history ran: a history starts only while more than %v of the run (-idem.duration %v) is left", stepsBound, limit)
	}
	t.Logf("answers:\n%s", counts(answers))
	t.Logf("what the histories did:\n%s", counts(did))
	if len(broken) == 0 {
		t.Logf("every rule held")
	}
	for _, p := range r.instances {
		for _, problem := range p.problems() {
			t.Errorf("%s", problem)
		}
	}
}
