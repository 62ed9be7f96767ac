package faultcheck_test

// The fault check: randomized histories of requests against two server
// instances and one store (a Redis; an SQL database in TestFaultCheckSQL),
// with faults injected at random moments, each history then held to the
// promises of the middleware.
//
// A history is a few keys of a few callers (each caller a scope of its
// own), each key sent as a chain of retries and a few duplicates and
// impostors (the key with another body), to both instances, while faults
// hit: Redis stopped (SIGSTOP), a reply lost, replies delayed, an instance
// cut off from Redis, an instance killed (SIGKILL) and started again,
// clients that give up or have deadlines, outer timeouts, handlers that
// panic before or after their status, that Release, that answer a
// transient error, and callers of Do whose function fails or is cut off;
// and faults of what a process or Redis holds: an instance drained by
// SIGTERM while cut off from Redis, Redis restarted empty (token-mode keys
// too), an outage at load that saturates the background queue, and a
// crowd of duplicates under a small maxclients. A Redis Cluster reshard
// is checked beside it (TestFaultCheckReshard): the rig has one Redis.
// Every history has a fresh key prefix and its own configuration (lease,
// timeouts, WithRetryAbandoned, store policy, cache).
//
// Every execution applies one effect, a write to the application's
// database (another redis-server, which no fault touches), fenced with the
// execution's token, and traces its start there. Once the history has
// settled (no request left inside an instance, every lease run out), the
// check compares the answers the callers got, the effects in the database
// and the state of every key in Redis (Inspect); the rules are in
// check_test.go. Effects are counted, not answers.
//
//	go test -race -count=1 -run '^TestFaultCheck$' -v ./internal/faultcheck             # bounded: 40 s of histories
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheck$' -v -timeout 0 -idem.duration=30m
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheck$' -v -timeout 0 -idem.histories=20000
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheck$' -v -idem.seed=42 -idem.from=17 -idem.histories=1
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheck$' -v -idem.faults=panic-after
//
// A failure names the seed, the history, its configuration and, per rule
// broken, the shortest story found: the events of the one key concerned
// (requests, answers, what its executions did) and the faults around them,
// in time order.

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
)

var (
	flagSeed      = flag.Uint64("idem.seed", 0, "fault check: seed of the histories (0: from the clock)")
	flagHistories = flag.Int("idem.histories", 0, "fault check: how many histories to run (0: as many as -idem.duration allows)")
	flagDuration  = flag.Duration("idem.duration", 0, "fault check: how long to run histories (0: 40s, or no limit with -idem.histories)")
	flagFrom      = flag.Int("idem.from", 0, "fault check: index of the first history, to replay a reported one with its seed")
	flagFaults    = flag.String("idem.faults", "", "fault check: the only fault kinds to inject, comma-separated (default: all)")
	flagSkip      = flag.String("idem.skip", "", "fault check: fault kinds never to inject, comma-separated")
	flagLanes     = flag.Int("idem.lanes", 3, "fault check: how many histories run at once")
	flagStories   = flag.Int("idem.stories", 1, "fault check: how many stories to tell per rule broken, shortest first")
	flagFirst     = flag.Bool("idem.first", false, "fault check: stop starting histories once a rule broke (scripts/mutants.sh)")
	flagArmed     = flag.Bool("idem.armed", false, "fault check: fail when a rule was never armed (default: in runs of 10 minutes or more with every fault kind)")
)

// boundedRun is how long a plain `go test` runs histories; with the start
// of the servers, under a minute in all.
const boundedRun = 40 * time.Second

// armedRun is how long a run must be for every rule to have come up: a
// long run fails when one never did.
const armedRun = 10 * time.Minute

// historyAllowance is about the longest a history takes, faults, settling
// and checks included: a history starts only while this much of the run
// is left.
const historyAllowance = 6 * time.Second

func TestFaultCheck(t *testing.T) {
	kinds, err := parseKinds(*flagFaults, *flagSkip, allKinds)
	if err != nil {
		t.Fatal(err)
	}
	runCheck(t, kinds, len(allKinds), boundedRun, func() *rig { return newRig(t) })
}

// TestFaultCheckSQL runs the fault check on the SQL store (NewSQL): SQLite
// always, PostgreSQL and MySQL/MariaDB when POSTGRES_DSN and MYSQL_DSN name
// a server. The rules are TestFaultCheck's; Redis's faults become the
// database's: its keys table locked by another connection (db-stall), every
// connection dropped and new ones refused for a while (db-restart), a lost
// reply (drop-reply: the next statement's, or a COMMIT's, the commit done),
// a slow or cut network (delay, blackhole), and on PostgreSQL waiters woken
// by LISTEN/NOTIFY through the same faulted proxy (listen). SQLite, one
// file the two instance processes share, has no connection to fault: its
// histories have the stall, kills and the clients' and handlers' faults.
//
//	go test -race -count=1 -run '^TestFaultCheckSQL$' -v ./internal/faultcheck                # bounded: 20 s a database
//	go test -race -count=1 ./internal/faultcheck -run '^TestFaultCheckSQL/postgres$' -v -timeout 0 -idem.duration=30m
func TestFaultCheckSQL(t *testing.T) {
	for _, kind := range []sqltest.Kind{sqltest.SQLite, sqltest.PostgreSQL, sqltest.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			known := sqlKinds(kind)
			kinds, err := parseKinds(*flagFaults, *flagSkip, known)
			if err != nil {
				t.Fatal(err)
			}
			runCheck(t, kinds, len(known), boundedSQLRun, func() *rig { return newSQLRig(t, sqltest.Open(t, kind)) })
		})
	}
}

// boundedSQLRun is how long a plain `go test` runs histories on each SQL
// database: the three together about as long as TestFaultCheck.
const boundedSQLRun = 20 * time.Second

// runCheck runs histories with the fault kinds on the rig newRig starts
// (of every kind the store has, known in all), for bounded unless the
// flags say otherwise, and reports what broke.
func runCheck(t *testing.T, kinds kindSet, known int, bounded time.Duration, newRig func() *rig) {
	seed, limit := runBounds(bounded)
	t.Logf("fault check: seed %d, fault kinds %s (the same run again: -idem.seed=%d, with the same -idem.faults and -idem.skip)",
		seed, kinds, seed)

	r := newRig()
	onSQL := r.store == nil
	began := time.Now()
	tl := newTally()
	var next atomic.Int64
	next.Store(int64(*flagFrom))
	var lanes sync.WaitGroup
	for range max(*flagLanes, 1) {
		lanes.Go(func() {
			for !r.broken.Load() { // a broken rule does not stop the run (but with -idem.first); a broken rig does
				if *flagFirst && tl.brokenAny() {
					return
				}
				i := int(next.Add(1) - 1)
				if *flagHistories > 0 && i >= *flagFrom+*flagHistories {
					return
				}
				if limit > 0 && time.Since(began) > limit-historyAllowance {
					return
				}
				p := newPlan(seed, i, kinds, onSQL)
				if limit > 0 && time.Since(began) > limit-p.allowance() {
					continue // a long history, left out near the end
				}
				h := r.run(p)
				if r.broken.Load() {
					return // the history's outcome is unknown
				}
				tl.add(h, check(h))
				r.forget(h)
			}
		})
	}
	lanes.Wait()

	tl.judgeWakeups()
	tl.judgeReplays()
	tl.report(t, replayCommand(t.Name(), seed, kinds, known), time.Since(began))
	if *flagArmed || limit >= armedRun && len(kinds) == known {
		for _, rule := range tl.neverArmed(onSQL) {
			t.Errorf("RULE NEVER ARMED: %s: its precondition never came up, so the run says nothing of it", rule)
		}
	}
	lost := int64(0)
	for _, p := range r.instances {
		if p.proxy != nil {
			lost += p.proxy.Dropped()
		}
	}
	t.Logf("replies of the store lost by the proxies: %d", lost)
	for _, p := range r.instances {
		for _, problem := range p.problems() {
			t.Errorf("%s", problem)
		}
	}
}

// runBounds reads the run's seed (from the clock unless -idem.seed) and how
// long it starts histories (0: until -idem.histories are done).
func runBounds(bounded time.Duration) (seed uint64, limit time.Duration) {
	seed = *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	limit = *flagDuration
	if limit == 0 && *flagHistories == 0 {
		limit = bounded
		if testing.Short() {
			limit = 10 * time.Second
		}
	}
	return seed, limit
}

// tally counts what a run did and found.
type tally struct {
	mu        sync.Mutex
	histories int
	injected  map[string]int        // faults by kind
	answers   map[string]int        // answers by class
	notes     map[string]int        // what a fault excused, by what
	armed     map[string]int        // occasions to break, by rule
	lags      []time.Duration       // waking duplicates' lags past their key's answer
	replays   []time.Duration       // later duplicates' times to replay, on the answer's other instance
	broken    map[string]int        // violations by rule
	shortest  map[string][]*finding // by rule, shortest story first, at most -idem.stories
}

// finding is one violation with what is needed to read and replay it.
type finding struct {
	index  int
	cfg    historyConfig
	key    string
	detail string
	story  []string
}

func newTally() *tally {
	return &tally{injected: map[string]int{}, answers: map[string]int{}, notes: map[string]int{}, broken: map[string]int{},
		armed: map[string]int{}, shortest: map[string][]*finding{}}
}

func (tl *tally) add(h *history, found []violation) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.histories++
	for k, n := range h.injected {
		tl.injected[k] += n
	}
	for k, n := range h.notes {
		tl.notes[k] += n
	}
	for k, n := range h.armed {
		tl.armed[k] += n
	}
	tl.lags = append(tl.lags, h.lags...)
	tl.replays = append(tl.replays, h.replays...)
	for _, x := range h.exchanges {
		tl.answers[read(x).label]++
	}
	for _, v := range found {
		tl.broken[v.rule]++
		f := &finding{index: h.plan.index, cfg: h.plan.cfg, detail: v.detail, story: h.story(v.key), key: "the whole history"}
		if v.key != nil {
			f.key = v.key.String()
		}
		kept := append(tl.shortest[v.rule], f)
		slices.SortStableFunc(kept, func(a, b *finding) int { return len(a.story) - len(b.story) })
		tl.shortest[v.rule] = kept[:min(len(kept), max(*flagStories, 1))]
	}
}

// brokenAny reports whether some history broke a rule.
func (tl *tally) brokenAny() bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.broken) > 0
}

// judgeWakeups holds the run's waking duplicates to ruleSlowWakeups: their
// median lag, once there are enough of them to tell, at most slowWakeup
// past what a replay on the other instance took in the same run. A woken
// duplicate is answered about a replay's time after the key's answer, and
// so is everything on a machine busy with other work; one that polls, a
// pause later.
func (tl *tally) judgeWakeups() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.lags) < 8 {
		return
	}
	median := func(ds []time.Duration) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	lag, replay := median(tl.lags), median(tl.replays)
	tl.notes[fmt.Sprintf("waking duplicates (median lag %v; a replay took %v, the median of %d)",
		lag.Round(time.Millisecond), replay.Round(time.Millisecond), len(tl.replays))] = len(tl.lags)
	if bound := slowWakeup + replay; lag > bound {
		tl.broken[ruleSlowWakeups]++
		tl.shortest[ruleSlowWakeups] = []*finding{{index: -1, key: "the whole run",
			detail: fmt.Sprintf("the median of %d waking duplicates replayed %v after their key's answer (at most %v: %v past "+
				"the %v a replay on the other instance took)", len(tl.lags), lag.Round(time.Millisecond),
				bound.Round(time.Millisecond), slowWakeup, replay.Round(time.Millisecond))}}
	}
}

// judgeReplays holds the run's duplicates sent after their key's answer,
// to the other instance, to ruleSlowReplays: their median time to replay
// it, once there are enough of them to tell, at most slowReplay. The key's
// answer is stored and its lease let go as the answer leaves: such a
// duplicate reads it in one round trip. One whose key stays held waits for
// a lease to lapse (hundreds of milliseconds); on a machine busy with
// other work a few are slow, not the median.
func (tl *tally) judgeReplays() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.replays) < 8 {
		return
	}
	ds := slices.Clone(tl.replays)
	slices.Sort(ds)
	replay := ds[len(ds)/2]
	tl.notes[fmt.Sprintf("duplicates sent after their key's answer to another instance (a replay took %v, the median)",
		replay.Round(time.Millisecond))] = len(ds)
	if replay > slowReplay {
		tl.broken[ruleSlowReplays]++
		tl.shortest[ruleSlowReplays] = []*finding{{index: -1, key: "the whole run",
			detail: fmt.Sprintf("the median of %d duplicates sent after their key's answer replayed it in %v (at most %v)",
				len(ds), replay.Round(time.Millisecond), slowReplay)}}
	}
}

// slowReplay bounds the median replay of a duplicate sent after its key's
// answer: the shortest store timeout a history draws, far above a round
// trip (a few milliseconds on a busy machine), far below a lease.
const slowReplay = 150 * time.Millisecond

// neverArmed lists the rules whose precondition never came up; on SQL,
// not those of a crowd under Redis's maxclients, which it has no fault for.
func (tl *tally) neverArmed(onSQL bool) []string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var never []string
	for _, rule := range checkedRules {
		if onSQL && (rule == ruleCrowdWaiter || rule == ruleCrowdFresh) {
			continue
		}
		if tl.armed[rule] == 0 {
			never = append(never, rule)
		}
	}
	return never
}

// replayCommand is the command that runs the history of the given index
// again, with its seed and fault kinds (the plans depend on both).
func replayCommand(test string, seed uint64, kinds kindSet, known int) func(index int) string {
	faults := ""
	if len(kinds) != known {
		faults = " -idem.faults=" + kinds.String()
	}
	return func(index int) string {
		return fmt.Sprintf("go test -race -count=1 ./internal/faultcheck -run '^%s$' -v -idem.seed=%d%s -idem.from=%d -idem.histories=1",
			test, seed, faults, index)
	}
}

func (tl *tally) report(t *testing.T, replay func(index int) string, took time.Duration) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	t.Logf("fault check: %d histories in %v", tl.histories, took.Round(time.Second))
	t.Logf("faults injected:\n%s", counts(tl.injected))
	t.Logf("answers:\n%s", counts(tl.answers))
	if len(tl.notes) > 0 {
		t.Logf("counted apart:\n%s", counts(tl.notes))
	}
	t.Logf("rules, with how often each was armed (its precondition came up) and broken:\n%s", tl.armedText())
	if len(tl.broken) == 0 {
		t.Logf("every rule held")
		return
	}
	t.Logf("rules broken:\n%s", counts(tl.broken))
	rules := make([]string, 0, len(tl.broken))
	for rule := range tl.broken {
		rules = append(rules, rule)
	}
	slices.Sort(rules)
	for _, rule := range rules {
		for i, f := range tl.shortest[rule] {
			which := "the shortest story"
			if i > 0 {
				which = fmt.Sprintf("story %d", i+1)
			}
			t.Errorf("RULE BROKEN: %s (%d times); %s, history %d, %s:\n  %s\n  config: %s\n%s\n  replay: %s",
				rule, tl.broken[rule], which, f.index, f.key, f.detail, f.cfg, indent(f.story), replay(f.index))
		}
	}
}

// armedText lists every rule with its armed and broken counts.
func (tl *tally) armedText() string {
	var b strings.Builder
	for _, rule := range checkedRules {
		fmt.Fprintf(&b, "  %7d armed  %5d broken  %s\n", tl.armed[rule], tl.broken[rule], rule)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// counts lists a count per name, largest first.
func counts(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %6d  %s\n", m[n], n)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func indent(lines []string) string {
	return "    " + strings.Join(lines, "\n    ")
}
