package faultcheck_test

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
)

// The kinds of fault a history may inject. -idem.faults picks some (all by
// default), -idem.skip leaves some out. Requests that run the handler
// normally, or slowly, and retries of the same key are always there: they
// are what the faults hit.
const (
	// Between an instance and its Redis.
	kindRedisStop = "redis-stop" // SIGSTOP of Redis, then SIGCONT
	kindDropReply = "drop-reply" // the reply to one command lost
	kindDelay     = "delay"      // every reply late for a while
	kindBlackhole = "blackhole"  // every byte lost for a while
	kindKill      = "kill"       // SIGKILL of an instance, then a restart
	kindPause     = "pause"      // SIGSTOP of an instance, then SIGCONT (steps workload)
	// Two takeovers of a key, each claim's reply lost, undone in the order
	// that hands the key back to the first (steps workload: takeovers_test.go).
	kindLostTakeovers = "lost-takeovers"
	// Clients.
	kindDisconnect     = "disconnect"      // the client gives up mid-request
	kindClientDeadline = "client-deadline" // the client's own deadline
	kindImpostor       = "impostor"        // another request with the same key
	kindOuterTimeout   = "outer-timeout"   // a route behind http.TimeoutHandler
	kindDeadline       = "deadline"        // a route behind a context deadline
	// Handlers and functions.
	kindPanicBefore = actPanicBefore
	kindPanicAfter  = actPanicAfter
	kindRelease     = actRelease
	kindTransient   = actTransient
	kindDo          = "do" // callers of Do
	kindCutoff      = actCutoff
	kindFnError     = actFnError
	// What a process or Redis holds: each in faultcheck_<kind>_test.go.
	kindDrain        = "drain"         // SIGTERM while the instance's Redis is cut off: its drain, then a restart
	kindRedisRestart = "redis-restart" // Redis killed and started again, empty, on its port
	kindSaturate     = "saturate"      // hundreds of new keys during an outage: the background queue refuses claims
	kindCrowd        = "crowd"         // hundreds of duplicates waiting on one key under a small maxclients
	kindRevoke       = "revoke"        // the operator revokes the token key; unspent tokens come after
	// The SQL database's own (TestFaultCheckSQL).
	kindDBStall   = "db-stall"   // the keys table locked by another connection, then unlocked
	kindDBRestart = "db-restart" // every connection dropped, new ones refused for a while; the data kept
	kindListen    = "listen"     // PostgreSQL: waiters woken by LISTEN/NOTIFY, the listener's connection faulted too
)

// allKinds are the kinds of fault on Redis (TestFaultCheck).
var allKinds = []string{
	kindRedisStop, kindDropReply, kindDelay, kindBlackhole, kindKill,
	kindDisconnect, kindClientDeadline, kindImpostor, kindOuterTimeout, kindDeadline,
	kindPanicBefore, kindPanicAfter, kindRelease, kindTransient, kindDo, kindCutoff, kindFnError,
	kindDrain, kindRedisRestart, kindSaturate, kindCrowd, kindRevoke, kindTakeover,
}

// sqlKinds are the kinds of fault on an SQL database (TestFaultCheckSQL):
// Redis's own become the database's (a stall, a restart), and those of a
// connection need one (SQLite, a file, has none).
func sqlKinds(kind sqltest.Kind) []string {
	kinds := []string{kindKill,
		kindDisconnect, kindClientDeadline, kindImpostor, kindOuterTimeout, kindDeadline,
		kindPanicBefore, kindPanicAfter, kindRelease, kindTransient, kindDo, kindCutoff, kindFnError,
		kindRevoke, kindDBStall}
	if kind != sqltest.SQLite {
		kinds = append(kinds, kindDropReply, kindDelay, kindBlackhole, kindDrain, kindSaturate, kindTakeover, kindDBRestart)
	}
	if kind == sqltest.PostgreSQL {
		kinds = append(kinds, kindListen)
	}
	return kinds
}

// kindSet is the kinds of fault a run injects.
type kindSet map[string]bool

// everyKind is every kind of fault on any store, once each: Redis's, the
// SQL databases' own, then the steps workload's own.
func everyKind() []string {
	kinds := slices.Clone(allKinds)
	for _, k := range slices.Concat(sqlKinds(sqltest.PostgreSQL), stepsFaultKinds, stepsSQLKinds(sqltest.PostgreSQL)) {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	return kinds
}

// parseKinds reads -idem.faults and -idem.skip, against the kinds known
// on the store under test. A kind -idem.faults names that the store does
// not have is left out (SQLite has no connection to blackhole), unless no
// kind the store has is left.
func parseKinds(only, skip string, known []string) (kindSet, error) {
	kinds := kindSet{}
	names := known
	if only != "" {
		names = strings.Split(only, ",")
	}
	for _, n := range names {
		if !slices.Contains(everyKind(), n) {
			return nil, fmt.Errorf("unknown fault kind %q (known: %s)", n, strings.Join(known, ","))
		}
		if slices.Contains(known, n) {
			kinds[n] = true
		}
	}
	if len(kinds) == 0 && only != "" {
		return nil, fmt.Errorf("none of the fault kinds %s is known on this store (known: %s)", only, strings.Join(known, ","))
	}
	if skip != "" {
		for _, n := range strings.Split(skip, ",") {
			if !slices.Contains(everyKind(), n) {
				return nil, fmt.Errorf("unknown fault kind %q (known: %s)", n, strings.Join(known, ","))
			}
			delete(kinds, n)
		}
	}
	return kinds, nil
}

func (k kindSet) String() string {
	var names []string
	for _, n := range everyKind() {
		if k[n] {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// A plan is one history, drawn from the run's seed and the history's index
// before anything is sent: the same seed gives the same plans (their
// timing on a busy machine is another matter).
type plan struct {
	index  int
	cfg    historyConfig
	keys   []*keyPlan
	faults []*faultPlan
	// late: token-mode keys are sent again once the history settled,
	// after instance lateRenew (-1: none) was started anew; revoke: the
	// key that signed their tokens was revoked before (revoke_test.go).
	late      bool
	lateRenew int
	revoke    bool
	// onSQL: the store is an SQL database (TestFaultCheckSQL).
	onSQL bool
	// alone: the history runs with no fault of its own and no other
	// history beside it, for a rule armed only while Redis answers every
	// instance (takeover_test.go).
	alone bool
}

// allowance is about the longest the history takes: a history starts only
// while this much of the run is left.
func (p *plan) allowance() time.Duration {
	if p.late {
		return historyAllowance + lateAllowance
	}
	return historyAllowance
}

// keyPlan is one key of a history: a caller (its scope), the key the caller
// sends, the route, and the requests made with it.
type keyPlan struct {
	scope, id, route string
	body, otherBody  string // the key's request, and an impostor's
	start            time.Duration
	// Token mode (routeForm): the instance that issues the key's token,
	// and the token, fetched before the history begins and sent in the
	// place of id.
	issuer int
	token  string
	// role is the key's part in a fault of its own (saturate, crowd); ""
	// for the history's own keys.
	role string
	// chain is sent one request after the other, each once the one
	// before it was answered (or given up): a client that retries.
	chain []*requestPlan
	// extras go at their own moments: duplicates (a double click, a
	// second instance's redelivery) and impostors.
	extras []*requestPlan
	// late go once the history settled, after a Redis restart or a
	// revocation (late_test.go).
	late []*requestPlan
}

func (k *keyPlan) String() string { return k.scope + "/" + k.id + " on " + k.route }

// value is the key as the caller sends it: its id, or its token.
func (k *keyPlan) value() string {
	if k.route == routeForm {
		return k.token
	}
	return k.id
}

// requests are the key's chain and extras.
func (k *keyPlan) requests() []*requestPlan {
	return slices.Concat(k.chain, k.extras, k.late)
}

// requestPlan is one request of a key.
type requestPlan struct {
	name     string
	key      *keyPlan
	at       time.Duration // extras: after the history's start; chain: after the previous answer
	instance int
	act      string
	pause    time.Duration // before the effect
	deaf     bool          // the pause ignores the context
	linger   time.Duration // after it
	impostor bool          // sent with the key's other body
	// The client gives up (disconnects) after this long; or, its own
	// deadline, after this long.
	disconnectAfter, deadline time.Duration
}

func (q *requestPlan) String() string {
	s := fmt.Sprintf("%s POST %s act=%s", q.name, q.key.route, q.act)
	if q.pause > 0 {
		s += fmt.Sprintf(" pause=%v", q.pause)
	}
	if q.linger > 0 {
		s += fmt.Sprintf(" linger=%v", q.linger)
	}
	if q.deaf {
		s += " deaf-to-its-context"
	}
	if q.impostor {
		s += " IMPOSTOR(other body)"
	}
	if q.disconnectAfter > 0 {
		s += fmt.Sprintf(" disconnects-after=%v", q.disconnectAfter)
	}
	if q.deadline > 0 {
		s += fmt.Sprintf(" client-deadline=%v", q.deadline)
	}
	return s
}

// faultPlan is one fault of a history, between an instance and Redis.
type faultPlan struct {
	kind string
	// at is after the history's start, or after the anchor request was
	// sent.
	at, dur  time.Duration
	anchor   *requestPlan
	instance int
	needle   string        // drop-reply: "" any command, else a command name
	delay    time.Duration // delay: per reply
	// crowd: Redis's maxclients stays small until these are answered.
	until []*requestPlan
}

// Routes of an instance.
const (
	routeKey          = "/key"
	routeOuterTimeout = "/outer-timeout"
	routeDeadline     = "/deadline"
	routeDo           = "/do"
	routeForm         = "/form"       // token mode
	routeFormToken    = "/form/token" // issues the tokens of routeForm
)

var (
	scopes = []string{"alice", "bob", "carol"}
	keyIDs = []string{"k1", "k2", "k3", "k4"}
)

// newPlan draws history index of the run with the given seed.
func newPlan(seed uint64, index int, kinds kindSet, onSQL bool) *plan {
	rng := rand.New(rand.NewPCG(seed, uint64(index)))
	p := &plan{index: index, cfg: drawConfig(rng, fmt.Sprintf("fc%xh%d", seed&0xffffff, index))}
	d := drawer{rng: rng, kinds: kinds, onSQL: onSQL}
	p.onSQL = onSQL

	// Keys: callers share key names, so that a key of one caller is
	// another's too, and neither may see the other's answer.
	type ident struct{ scope, id string }
	seen := map[ident]bool{}
	callers := scopes[:1+rng.IntN(len(scopes))]
	for range 2 + rng.IntN(4) {
		id := ident{callers[rng.IntN(len(callers))], keyIDs[rng.IntN(len(keyIDs))]}
		if seen[id] {
			continue
		}
		seen[id] = true
		p.keys = append(p.keys, d.key(id.scope, id.id))
	}
	p.cfg.Listen = d.chance(kindListen, 0.5)
	p.faults = d.faults()
	d.saturation(p)
	d.crowd(p)
	d.takeover(p)
	d.restartMidRun(p)
	d.late(p)
	n := 0
	for _, k := range p.keys {
		for _, q := range k.requests() {
			n++
			q.name = fmt.Sprintf("#%d", n)
		}
	}
	p.faults = append(p.faults, d.outageAtRelease(p)...)
	p.faults = append(p.faults, d.drain(p)...)
	if p.alone {
		p.faults = nil
	}
	return p
}

func drawConfig(rng *rand.Rand, prefix string) historyConfig {
	pick := func(ds ...time.Duration) time.Duration { return ds[rng.IntN(len(ds))] }
	ms := time.Millisecond
	return historyConfig{
		Prefix:         prefix,
		Lease:          pick(600*ms, 800*ms, 1000*ms),
		StoreTimeout:   pick(150*ms, 200*ms, 300*ms),
		Wait:           pick(300*ms, 500*ms, 800*ms),
		ExecTimeout:    pick(700*ms, 1000*ms, 1500*ms),
		OuterTimeout:   pick(100*ms, 200*ms, 300*ms),
		RetryAbandoned: rng.IntN(5) < 2,
		NoTransient:    rng.IntN(2) == 0,
		Cache:          rng.IntN(2) == 0,
		TokenKeys:      "sign=" + drawKey(rng),
	}
}

// drawKey draws a token key from rng, so that a seed gives the same ring.
func drawKey(rng *rand.Rand) string {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(rng.IntN(256))
	}
	return base64.RawURLEncoding.EncodeToString(key)
}

// drawer draws the parts of a plan.
type drawer struct {
	rng   *rand.Rand
	kinds kindSet
	onSQL bool // the store is an SQL database
}

func (d drawer) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(d.rng.Int64N(int64(hi-lo)+1))
}

func (d drawer) chance(k string, p float64) bool { return d.kinds[k] && d.rng.Float64() < p }

func (d drawer) key(scope, id string) *keyPlan {
	k := newKey(scope, id, d.route(), "")
	k.start = d.between(0, 500*time.Millisecond)
	if k.route == routeForm {
		k.issuer = d.rng.IntN(2)
	}
	for i := range 1 + d.rng.IntN(3) {
		q := d.request(k, i == 0)
		q.at = d.between(20*time.Millisecond, 300*time.Millisecond)
		if i == 0 {
			q.at = k.start
		}
		k.chain = append(k.chain, q)
	}
	for range d.rng.IntN(4) {
		q := d.request(k, false)
		q.at = k.start + d.between(0, 700*time.Millisecond)
		q.impostor = d.chance(kindImpostor, 0.25)
		k.extras = append(k.extras, q)
		if q.impostor && d.rng.IntN(2) == 0 {
			// The key's own request right behind the impostor, on the
			// same instance: it meets the impostor's request inside the
			// instance, before Redis has told either apart.
			twin := d.request(k, false)
			twin.at, twin.instance = q.at+d.between(time.Millisecond, 30*time.Millisecond), q.instance
			k.extras = append(k.extras, twin)
		}
	}
	return k
}

// newKey is a key with its request bodies.
func newKey(scope, id, route, role string) *keyPlan {
	return &keyPlan{scope: scope, id: id, route: route, role: role,
		body:      fmt.Sprintf(`{"order":"%s/%s","amount":7}`, scope, id),
		otherBody: fmt.Sprintf(`{"order":"%s/%s","amount":8}`, scope, id)}
}

func (d drawer) route() string {
	routes := []string{routeKey, routeKey, routeKey, routeKey, routeForm}
	if d.kinds[kindOuterTimeout] {
		routes = append(routes, routeOuterTimeout)
	}
	if d.kinds[kindDeadline] {
		routes = append(routes, routeDeadline)
	}
	if d.kinds[kindDo] || d.kinds[kindCutoff] || d.kinds[kindFnError] {
		routes = append(routes, routeDo, routeDo)
	}
	return routes[d.rng.IntN(len(routes))]
}

// request draws one request of k; a key's first request more often does
// something out of the ordinary than its retries and duplicates.
func (d drawer) request(k *keyPlan, first bool) *requestPlan {
	q := &requestPlan{key: k, instance: d.rng.IntN(2), act: actNormal}
	special := 0.2
	if first {
		special = 0.45
	}
	var acts []string
	switch k.route {
	case routeKey:
		acts = []string{actPanicBefore, actPanicAfter, actRelease, actTransient}
	case routeDo:
		acts = []string{actCutoff, actFnError}
	}
	acts = slices.DeleteFunc(acts, func(a string) bool { return !d.kinds[a] })
	switch {
	case len(acts) > 0 && d.rng.Float64() < special:
		q.act = acts[d.rng.IntN(len(acts))]
	case d.rng.IntN(2) == 0:
		q.act = actSlow
	}
	switch q.act {
	case actSlow:
		q.pause = d.between(50*time.Millisecond, 450*time.Millisecond)
		if d.rng.IntN(5) == 0 {
			// Long enough for a lease to run out under it, and for the
			// execution timeout to cut it short.
			q.pause = d.between(450*time.Millisecond, 1300*time.Millisecond)
		}
		q.linger = d.between(0, 150*time.Millisecond)
		// A handler deaf to its context carries on to its effect however
		// its context ended: the fencing token is what stops a stale one.
		q.deaf = d.rng.IntN(3) == 0
	case actPanicAfter, actCutoff:
		q.pause = d.between(0, 100*time.Millisecond)
	case actRelease, actTransient, actPanicBefore, actFnError:
		// The validation, or the call that fails, takes a while: a fault
		// may begin between the claim and the release.
		q.pause = d.between(0, 300*time.Millisecond)
	}
	if d.chance(kindDisconnect, 0.08) {
		q.disconnectAfter = d.between(10*time.Millisecond, 400*time.Millisecond)
	} else if d.chance(kindClientDeadline, 0.08) {
		q.deadline = d.between(50*time.Millisecond, 600*time.Millisecond)
	}
	return q
}

// faults draws up to three faults between the instances and Redis; a kill
// only in a quarter of the histories, since an instance takes a while to
// start again.
func (d drawer) faults() []*faultPlan {
	var kinds []string
	for _, k := range []string{kindRedisStop, kindDropReply, kindDelay, kindBlackhole, kindDBStall} {
		if d.kinds[k] {
			kinds = append(kinds, k)
		}
	}
	var fs []*faultPlan
	if len(kinds) > 0 {
		for range d.rng.IntN(4) {
			fs = append(fs, d.fault(kinds[d.rng.IntN(len(kinds))]))
		}
	}
	if d.chance(kindKill, 0.25) {
		fs = append(fs, d.fault(kindKill))
	}
	if d.chance(kindRedisRestart, 0.12) {
		fs = append(fs, d.fault(kindRedisRestart))
	}
	if d.chance(kindDBRestart, 0.12) {
		fs = append(fs, d.fault(kindDBRestart))
	}
	return fs
}

// outageAtRelease aims, in some histories, a brief outage at the moment
// a request's handler gives its key up: random faults rarely hit that
// moment, and the release must get through a brief outage.
func (d drawer) outageAtRelease(p *plan) []*faultPlan {
	var kinds []string
	for _, k := range []string{kindRedisStop, kindBlackhole, kindDBStall} {
		if d.kinds[k] {
			kinds = append(kinds, k)
		}
	}
	var givers []*requestPlan
	for _, k := range p.keys {
		for _, q := range k.requests() {
			if releasing(q.act, p.cfg) {
				givers = append(givers, q)
			}
		}
	}
	if len(kinds) == 0 || len(givers) == 0 || d.rng.IntN(2) == 0 {
		return nil
	}
	q := givers[d.rng.IntN(len(givers))]
	return []*faultPlan{{
		kind: kinds[d.rng.IntN(len(kinds))], anchor: q, instance: q.instance,
		// The handler gives the key up about its pause after the request
		// is sent; the outage begins a little before and stays brief.
		at:  max(q.pause-d.between(0, 40*time.Millisecond), 0),
		dur: d.between(60*time.Millisecond, p.cfg.briefOutage()-50*time.Millisecond),
	}}
}

func (d drawer) fault(kind string) *faultPlan {
	f := &faultPlan{kind: kind, at: d.between(0, 1500*time.Millisecond), instance: d.rng.IntN(2)}
	switch kind {
	case kindRedisStop, kindBlackhole, kindDBStall:
		// Half of them brief (within half the shortest lease), half long
		// enough for leases to run out.
		f.dur = d.between(100*time.Millisecond, 300*time.Millisecond)
		if d.rng.IntN(2) == 0 {
			f.dur = d.between(300*time.Millisecond, 1500*time.Millisecond)
		}
	case kindDelay:
		f.dur = d.between(200*time.Millisecond, time.Second)
		f.delay = d.between(20*time.Millisecond, 300*time.Millisecond)
	case kindDropReply:
		f.needle = []string{"", "evalsha"}[d.rng.IntN(2)]
		if d.onSQL {
			// An SQL database: the reply to a COMMIT lost, the commit
			// done or not.
			f.needle = []string{"", "commit"}[d.rng.IntN(2)]
		}
	case kindKill, kindRedisRestart:
		f.dur = d.between(50*time.Millisecond, 300*time.Millisecond) // down before the restart begins
	case kindDBRestart:
		// Half of them the connections dropped only, half a database
		// down for a while.
		if d.rng.IntN(2) == 0 {
			f.dur = d.between(100*time.Millisecond, 1500*time.Millisecond)
		}
	}
	return f
}
