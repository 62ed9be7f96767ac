package faultcheck_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/pgnotify"
	"github.com/onceonly/idempotency/sqldialect"
)

// The server instances of the fault check. Each is a separate process (this
// test binary, started again with -test.run=^TestFaultCheckInstance$), so
// that the check can kill one with SIGKILL in the middle of a request, as
// a crash or an OOM kill would, and start it again.
//
// One process serves every history: each history sends its middleware
// configuration with every request, and the instance keeps one Middleware
// per history (per key prefix), so that a new configuration needs no
// restart.

const (
	// instanceEnv carries an instance's instanceSpec, in JSON; without it
	// TestFaultCheckInstance skips.
	instanceEnv = "IDEM_FAULTCHECK_INSTANCE"
	// listeningLine is what an instance prints, followed by its address,
	// once it accepts requests.
	listeningLine = "faultcheck instance listening on "
	// drainedLine is what it prints once a drain ended, followed by
	// "complete" or why not.
	drainedLine = "faultcheck instance drained: "
	// outerTimeoutMessage is the body http.TimeoutHandler answers when the
	// outer timeout of the /outer-timeout route fires.
	outerTimeoutMessage = "outer timeout"
)

// Request headers the driver sets, and response headers the instance adds.
const (
	configHeader     = "X-Fc-Config"     // the history's historyConfig, in JSON
	clientHeader     = "X-Client"        // the caller: the key's scope
	actHeader        = "X-Fc-Act"        // what the handler does (an act)
	pauseHeader      = "X-Fc-Pause"      // milliseconds before the effect
	deafHeader       = "X-Fc-Deaf"       // "1": the pause ignores the context
	lingerHeader     = "X-Fc-Linger"     // milliseconds after it
	requestHeader    = "X-Fc-Request"    // the driver's name of the request
	deliberateHeader = "X-Fc-Deliberate" // on the handler's own refusals: which
	outcomeHeader    = "X-Fc-Outcome"    // on /do answers: what Do reported
)

// What a handler (or Do's function) does, chosen by the driver per request.
const (
	actNormal      = "normal"       // the effect, then 201
	actSlow        = "slow"         // a pause, the effect, a linger, then 201
	actPanicBefore = "panic-before" // panics before any effect or status
	actPanicAfter  = "panic-after"  // the effect, the status and part of the body, then panics
	actRelease     = "release"      // Release, no effect, 422
	actTransient   = "transient"    // no effect, 503 (released under StoreNoTransient)
	actCutoff      = "do-cutoff"    // Do: the effect, then runs until its context ends
	actFnError     = "do-error"     // Do: fails before any effect
)

// Why a handler's own refusal was given (deliberateHeader).
const (
	refusedRelease   = actRelease
	refusedTransient = actTransient
	refusedCancelled = "cancelled"  // its context ended before the effect
	refusedFencedOut = "fenced-out" // its fencing token was refused
	refusedFnError   = "fn-error"   // Do's function failed
	refusedCutoff    = "cut-off"    // Do's function was cut off after its effect
)

// historyConfig is one history's middleware configuration.
type historyConfig struct {
	Prefix         string // a fresh key prefix per history
	Lease          time.Duration
	StoreTimeout   time.Duration
	Wait           time.Duration
	ExecTimeout    time.Duration
	OuterTimeout   time.Duration // of /outer-timeout and /deadline
	RetryAbandoned bool
	NoTransient    bool // StoreNoTransient instead of StoreAll
	Cache          bool // the in-process response cache
	// TokenKeys is the key ring every instance signs and checks tokens
	// with, as ParseTokenKeys reads it: the same configuration everywhere.
	TokenKeys string
	// Listen: on PostgreSQL, waiting duplicates are woken by LISTEN/NOTIFY
	// (WithSQLListener) instead of polling.
	Listen bool
}

// recordTTL outlives every history by far: a record that expired during
// one would let a retry run again for a reason that is no fault.
const recordTTL = 5 * time.Minute

func (c historyConfig) options() []idempotency.Option {
	opts := []idempotency.Option{
		idempotency.WithKeyPrefix(c.Prefix),
		idempotency.WithLockLease(c.Lease),
		idempotency.WithStoreTimeout(c.StoreTimeout),
		idempotency.WithWaitTimeout(c.Wait),
		idempotency.WithExecutionTimeout(c.ExecTimeout),
		idempotency.WithRecordTTL(recordTTL),
		idempotency.WithScope(func(r *http.Request) (string, error) {
			if c := r.Header.Get(clientHeader); c != "" {
				return c, nil
			}
			return "", errors.New("no client")
		}),
		idempotency.WithLogger(slog.New(drainLog{slog.NewJSONHandler(os.Stdout, nil)})),
	}
	if ring, err := idempotency.ParseTokenKeys(c.TokenKeys); err == nil {
		opts = append(opts, idempotency.WithTokenKeys(ring))
	}
	if c.RetryAbandoned {
		opts = append(opts, idempotency.WithRetryAbandoned())
	}
	if c.NoTransient {
		opts = append(opts, idempotency.WithStorePolicy(idempotency.StoreNoTransient))
	}
	if !c.Cache {
		opts = append(opts, idempotency.WithResponseCache(0, 0))
	}
	return opts
}

// briefOutage is the longest outage, in all, that a release must get
// through: within half a lease, so that the lease cannot run out under
// it, and within two store timeouts, a few tries of the release.
func (c historyConfig) briefOutage() time.Duration {
	return min(c.Lease/2, 2*c.StoreTimeout)
}

func (c historyConfig) String() string {
	policy := "StoreAll"
	if c.NoTransient {
		policy = "StoreNoTransient"
	}
	s := fmt.Sprintf("prefix=%s lease=%v storeTimeout=%v wait=%v execTimeout=%v outerTimeout=%v retryAbandoned=%v policy=%s cache=%v",
		c.Prefix, c.Lease, c.StoreTimeout, c.Wait, c.ExecTimeout, c.OuterTimeout, c.RetryAbandoned, policy, c.Cache)
	if c.Listen {
		s += " listen=LISTEN/NOTIFY"
	}
	return s
}

// instanceSpec is what an instance process is started with.
type instanceSpec struct {
	Name string // "a" or "b"
	// Store is the middleware's store, through this instance's fault
	// proxy: a Redis's address, or, when Kind names an SQL database
	// (sqltest.Kind), the DSN Driver opens, which speaks Dialect, its keys
	// in Table.
	Store, Kind, Driver, Table string
	Dialect                    sqldialect.Dialect
	Effects                    string // the application's database
	// Drain bounds a graceful shutdown (SIGTERM), http.Server.Shutdown and
	// the middlewares' Shutdown together.
	Drain time.Duration
}

// trace is one line of a key's server-side log, kept in the application's
// database next to the effects: what the checker reads back.
type trace struct {
	Kind     string `json:"k"` // traceStart, traceEffect, traceFencedOut, traceCancelled
	Exec     string `json:"x"` // the execution's id, unique across restarts
	Fence    uint64 `json:"f"`
	Act      string `json:"a,omitempty"`
	Record   string `json:"r,omitempty"` // the key's record name (Execution.Key)
	Request  string `json:"q,omitempty"` // the driver's name of the request
	Instance string `json:"i"`
	Cause    string `json:"c,omitempty"` // of a cancellation
	At       int64  `json:"t"`           // Unix nanoseconds
}

const (
	traceStart     = "start"
	traceEffect    = "effect"
	traceFencedOut = "fenced-out"
	traceCancelled = "cancelled"
	causeLockLost  = "lock lost"
	causeDeadline  = "deadline"
)

func traceKey(prefix, scope, key string) string {
	return "fc:" + prefix + ":" + scope + ":" + key + ":trace"
}
func fenceKey(prefix, scope, key string) string {
	return "fc:" + prefix + ":" + scope + ":" + key + ":fence"
}

// effectScript is the effect every execution is about: one write to the
// application's database, under the execution's fencing token, as the
// FencingToken documentation asks of storage. It is applied only when the
// token is above every token the key's effects were applied with, and
// refused otherwise (a stale executor writing after a newer one); either
// way the attempt is traced.
//
// KEYS[1] the key's trace, KEYS[2] the highest token applied
// ARGV[1] the token, ARGV[2] the trace if applied, ARGV[3] if refused
var effectScript = redis.NewScript(`
local high = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > high then
  redis.call('SET', KEYS[2], ARGV[1])
  redis.call('RPUSH', KEYS[1], ARGV[2])
  return 1
end
redis.call('RPUSH', KEYS[1], ARGV[3])
return 0
`)

// answerBody is what the handler answers, and what Do's function returns:
// it names the caller, the key and the execution, so that the checker can
// tell whose answer a caller got. Its own refusals name why.
type answerBody struct {
	Scope      string `json:"scope"`
	Key        string `json:"key"`
	Exec       string `json:"exec"`
	Fence      uint64 `json:"fence"`
	Deliberate string `json:"deliberate,omitempty"`
}

// TestFaultCheckInstance is a server instance of TestFaultCheck: started by
// it with instanceEnv set, it serves until it is killed.
func TestFaultCheckInstance(t *testing.T) {
	raw := os.Getenv(instanceEnv)
	if raw == "" {
		t.Skip("a server process of TestFaultCheck, which starts it")
	}
	var spec instanceSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("%s: %v", instanceEnv, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(listeningLine + ln.Addr().String())
	go watchScheduling(nil, printStarved) // until the process ends
	s, err := newInstance(spec)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: s,
		// A handler's panic is logged by net/http with its stack; the
		// panics here are the check's own.
		ErrorLog:          log.New(io.Discard, "", 0),
		ReadHeaderTimeout: 10 * time.Second,
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		t.Fatal(err)
	case <-term:
		s.drain(srv)
	}
}

// drain shuts the instance down as example/main.go does, under one
// deadline: the server stops taking requests and waits for those in
// flight, then every middleware the process made finishes the stores and
// releases that Redis did not take. What it left undone the middlewares
// log (drainLog); the last line says how the drain ended.
func (s *instance) drain(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), s.spec.Drain)
	defer cancel()
	err := srv.Shutdown(ctx)
	s.mu.Lock()
	all := slices.Clone(s.made)
	s.mu.Unlock()
	for _, m := range all {
		if e := m.Shutdown(ctx); e != nil {
			err = e
		}
	}
	outcome := "complete"
	if err != nil {
		outcome = err.Error()
	}
	fmt.Println(drainedLine + outcome)
}

// drainLog passes on to the instance's output, as JSON lines, what a
// middleware's Shutdown logs (the keys a drain left undone, which the check
// reads) and every warning or error about one key (which a broken drain
// rule quotes). Everything else the middleware logs is dropped.
type drainLog struct{ slog.Handler }

// shutdownLog is how the middleware's Shutdown messages begin.
const shutdownLog = "idempotency: shutdown:"

func (d drainLog) Handle(ctx context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, shutdownLog) && (r.Level < slog.LevelWarn || !hasKey(r)) {
		return nil
	}
	return d.Handler.Handle(ctx, r)
}

// hasKey reports whether r names a key.
func hasKey(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == "key"
		return !found
	})
	return found
}

func (d drainLog) WithAttrs(as []slog.Attr) slog.Handler { return drainLog{d.Handler.WithAttrs(as)} }
func (d drainLog) WithGroup(name string) slog.Handler    { return drainLog{d.Handler.WithGroup(name)} }

// instance serves the routes of every history.
type instance struct {
	spec    instanceSpec
	store   *redis.Client // the middleware's Redis, through the fault proxy
	sql     *sql.DB       // or its SQL database
	effects *redis.Client // the application's database
	pid     int
	runs    atomic.Int64

	mu        sync.Mutex
	histories map[string]*historyRoutes // by key prefix
	recent    []string                  // prefixes, oldest first
	// made is the middlewares the process made last, also those of
	// histories no longer kept, whose background work a drain still waits
	// for; older ones' work was done long before.
	made []*idempotency.Middleware
}

// keptMiddlewares bounds made: far more histories than run at once.
const keptMiddlewares = 256

// keptHistories bounds how many histories' middlewares an instance keeps:
// a few run at once, and a finished one is never asked again.
const keptHistories = 32

func newInstance(spec instanceSpec) (*instance, error) {
	s := &instance{
		spec:      spec,
		effects:   redis.NewClient(&redis.Options{Addr: spec.Effects}),
		pid:       os.Getpid(),
		histories: map[string]*historyRoutes{},
	}
	if spec.Kind == "" {
		// ContextTimeoutEnabled, as the documentation asks: the store
		// timeout then bounds every exchange with a stalled Redis.
		s.store = redis.NewClient(&redis.Options{Addr: spec.Store, ContextTimeoutEnabled: true})
		return s, nil
	}
	db, err := openTimed(spec.Driver, spec.Store, printSlowDial)
	if err != nil {
		return nil, err
	}
	// A pool of its own size, as the example's: uncapped, a saturation's
	// burst opens a connection per request, past PostgreSQL's
	// max_connections (100 by default), and the refused ones answer 503
	// with nothing between the instance and its database but itself.
	// Its idle connections stay open: database/sql keeps 2 by default, so
	// after every burst the next one dials again, and a new PostgreSQL
	// connection (a backend forked, its start-up) can take longer than a
	// history's store timeout on a busy machine.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	s.sql = db
	return s, nil
}

// newMiddleware makes a history's middleware on the instance's store.
func (s *instance) newMiddleware(cfg historyConfig, opts ...idempotency.Option) *idempotency.Middleware {
	opts = append(cfg.options(), opts...)
	if s.sql == nil {
		return idempotency.New(s.store, opts...)
	}
	opts = append(opts, idempotency.WithSQLTable(s.spec.Table))
	if cfg.Listen {
		opts = append(opts, idempotency.WithSQLListener(pgnotify.Listener(s.sql)))
	}
	return idempotency.NewSQL(s.sql, s.spec.Dialect, opts...)
}

func (s *instance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/inflight" {
		fmt.Fprint(w, s.inflight(r.URL.Query().Get("prefix")))
		return
	}
	var cfg historyConfig
	if err := json.Unmarshal([]byte(r.Header.Get(configHeader)), &cfg); err != nil || cfg.Prefix == "" {
		http.Error(w, "bad "+configHeader, http.StatusBadRequest)
		return
	}
	s.routes(cfg).mux.ServeHTTP(w, r)
}

// historyRoutes are one history's routes, behind its middleware.
type historyRoutes struct {
	ring     string // the key ring they were made with
	m        *idempotency.Middleware
	mux      *http.ServeMux
	inflight atomic.Int64 // requests inside the middleware
}

// routes returns the history's routes, made on its first request, and
// made again when its key ring changed (a revocation), as an instance
// restarted with a new configuration would. The middleware is made
// outside the lock: New asks Redis for its eviction policy, which takes a
// while when a fault is on.
func (s *instance) routes(cfg historyConfig) *historyRoutes {
	s.mu.Lock()
	h := s.histories[cfg.Prefix]
	s.mu.Unlock()
	if h != nil && h.ring == cfg.TokenKeys {
		return h
	}
	h = s.newRoutes(cfg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.made = append(s.made, h.m)
	if len(s.made) > keptMiddlewares {
		s.made = slices.Delete(s.made, 0, len(s.made)-keptMiddlewares)
	}
	if first := s.histories[cfg.Prefix]; first != nil && first.ring == cfg.TokenKeys {
		return first // another request of the history made them meanwhile
	}
	s.histories[cfg.Prefix] = h
	s.recent = append(s.recent, cfg.Prefix)
	if len(s.recent) > keptHistories {
		delete(s.histories, s.recent[0])
		s.recent = s.recent[1:]
	}
	return h
}

func (s *instance) newRoutes(cfg historyConfig) *historyRoutes {
	m := s.newMiddleware(cfg)
	h := &historyRoutes{ring: cfg.TokenKeys, m: m, mux: http.NewServeMux()}
	protected := h.counted(m.ProtectKey(http.HandlerFunc(s.handle)))
	h.mux.Handle("POST /key", protected)
	// A timeout handler outside the middleware: it answers 503 itself
	// when the time is up, and the request's context ends.
	h.mux.Handle("POST /outer-timeout", http.TimeoutHandler(protected, cfg.OuterTimeout, outerTimeoutMessage))
	// A middleware that only puts a deadline on the request's context,
	// as many frameworks' timeout middlewares do.
	h.mux.Handle("POST /deadline", withDeadline(cfg.OuterTimeout, protected))
	h.mux.Handle("POST /do", h.counted(s.doHandler(m)))
	h.mux.Handle("POST "+routeSteps, h.counted(s.stepsHandler(cfg))) // steps_test.go
	// Token mode: the token is issued to the caller's scope, and spent on
	// the form route.
	h.mux.Handle("GET "+routeFormToken, m.TokenHandler())
	h.mux.Handle("POST "+routeForm, h.counted(m.Protect(http.HandlerFunc(s.handle))))
	return h
}

// counted counts the requests inside next: the driver waits for none to be
// left before it checks a history, since a handler runs on after its client
// left or its outer timeout answered.
func (h *historyRoutes) counted(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.inflight.Add(1)
		defer h.inflight.Add(-1)
		next.ServeHTTP(w, r)
	})
}

func (s *instance) inflight(prefix string) int64 {
	s.mu.Lock()
	h := s.histories[prefix]
	s.mu.Unlock()
	if h == nil {
		return 0
	}
	return h.inflight.Load()
}

func withDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// handle is the protected handler of the key-mode routes.
func (s *instance) handle(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	x := s.begin(ctx, r, r.Header.Get(clientHeader), r.Header.Get(idempotency.KeyHeader))
	switch x.act {
	case actPanicBefore, actRelease, actTransient:
		time.Sleep(x.pauseFor) // validating the request, or calling what fails
	}
	switch x.act {
	case actPanicBefore:
		panic("a handler fails before it did or answered anything")
	case actRelease:
		idempotency.Release(ctx) // a validation failure: nothing was done
		x.answer(w, http.StatusUnprocessableEntity, refusedRelease)
		return
	case actTransient:
		x.answer(w, http.StatusServiceUnavailable, refusedTransient)
		return
	}
	if !x.pause(ctx) {
		x.answer(w, http.StatusServiceUnavailable, refusedCancelled)
		return
	}
	if !x.effect() {
		x.answer(w, http.StatusConflict, refusedFencedOut)
		return
	}
	time.Sleep(x.linger) // after the effect, the handler answers whatever happens
	if x.act == actPanicAfter {
		// As httputil.ReverseProxy does when its backend fails mid-body:
		// the status and part of the body went out, then it aborts.
		body := x.body("")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body[:len(body)/2])
		panic(http.ErrAbortHandler)
	}
	x.answer(w, http.StatusCreated, "")
}

// Errors of Do's function, each answered as a refusal of its own.
var (
	errFnFailed  = errors.New("the function failed before any effect")
	errCancelled = errors.New("the function's context ended before its effect")
	errFencedOut = errors.New("the function's fencing token was refused")
)

// doHandler answers with what Do returns for the request's key; Do's
// function does what the handler of the key routes does.
func (s *instance) doHandler(m *idempotency.Middleware) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		input, _ := io.ReadAll(r.Body)
		scope, id := r.Header.Get(clientHeader), r.Header.Get(idempotency.KeyHeader)
		var (
			x       *run
			own     error // what the function returned, to tell it from the middleware's errors
			outcome idempotency.Outcome
		)
		res, err := idempotency.Do(r.Context(), m, idempotency.Key{Scope: scope, ID: id, Input: input},
			func(ctx context.Context) (answerBody, error) {
				x = s.begin(ctx, r, scope, id)
				var res answerBody
				res, own = x.function(ctx)
				return res, own
			}, idempotency.ReportOutcome(&outcome))
		w.Header().Set(outcomeHeader, outcome.String())
		switch {
		case err == nil:
			writeJSON(w, http.StatusCreated, "", res)
		case own != nil && errors.Is(err, own):
			// The function's own error, alone or with why the middleware
			// cut it off (ErrExecutionTimeout, ErrLockLost).
			x.refuseFor(w, own)
		case outcome == idempotency.ClientGone:
			// Nobody listens.
		default:
			idempotency.DefaultErrorHandler(w, r, err)
		}
	})
}

// run is one execution of the handler or of Do's function.
type run struct {
	s                  *instance
	scope, key, act    string
	exec, record, name string
	fence              uint64
	prefix             string
	pauseFor, linger   time.Duration
	deaf               bool
}

// begin traces the start of an execution.
func (s *instance) begin(ctx context.Context, r *http.Request, scope, key string) *run {
	e, _ := idempotency.ExecutionOf(ctx)
	var cfg historyConfig
	json.Unmarshal([]byte(r.Header.Get(configHeader)), &cfg)
	x := &run{
		s: s, scope: scope, key: key, act: r.Header.Get(actHeader),
		exec:   fmt.Sprintf("%s%d.%d", s.spec.Name, s.pid, s.runs.Add(1)),
		record: e.Key, fence: e.Fence, name: r.Header.Get(requestHeader), prefix: cfg.Prefix,
		pauseFor: millis(r.Header.Get(pauseHeader)), linger: millis(r.Header.Get(lingerHeader)),
		deaf: r.Header.Get(deafHeader) == "1",
	}
	x.trace(trace{Kind: traceStart, Act: x.act, Record: x.record, Request: x.name})
	return x
}

func millis(s string) time.Duration {
	n, _ := strconv.Atoi(s)
	return time.Duration(n) * time.Millisecond
}

// function is Do's function.
func (x *run) function(ctx context.Context) (answerBody, error) {
	if x.act == actFnError {
		time.Sleep(x.pauseFor) // calling what fails
		return answerBody{}, errFnFailed
	}
	if !x.pause(ctx) {
		return answerBody{}, errCancelled
	}
	if !x.effect() {
		return answerBody{}, errFencedOut
	}
	if x.act == actCutoff {
		// Runs until the middleware cuts it off (the execution timeout or
		// a lost lease), and reports that, as a function that waits on a
		// slow dependency does.
		<-ctx.Done()
		x.cancelled(ctx)
		return answerBody{}, ctx.Err()
	}
	time.Sleep(x.linger)
	return x.result(""), nil
}

// refuseFor answers an error Do's function returned.
func (x *run) refuseFor(w http.ResponseWriter, err error) {
	switch err {
	case errFnFailed:
		x.answer(w, http.StatusFailedDependency, refusedFnError)
	case errCancelled:
		x.answer(w, http.StatusServiceUnavailable, refusedCancelled)
	case errFencedOut:
		x.answer(w, http.StatusConflict, refusedFencedOut)
	default: // the context's error, after the effect
		x.answer(w, http.StatusGatewayTimeout, refusedCutoff)
	}
}

// pause waits before the effect, as a handler that first calls something
// slow; it reports false, and traces why, when the context ends first,
// unless the handler is deaf to its context.
func (x *run) pause(ctx context.Context) bool {
	if x.pauseFor <= 0 {
		return true
	}
	if x.deaf {
		time.Sleep(x.pauseFor)
		return true
	}
	timer := time.NewTimer(x.pauseFor)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		x.cancelled(ctx)
		return false
	}
}

func (x *run) cancelled(ctx context.Context) {
	cause := context.Cause(ctx)
	why := cause.Error()
	switch {
	case errors.Is(cause, idempotency.ErrLockLost):
		why = causeLockLost
	case errors.Is(cause, context.DeadlineExceeded):
		why = causeDeadline
	}
	x.trace(trace{Kind: traceCancelled, Cause: why})
}

// effect applies the execution's effect, fenced; false when its token was
// refused.
func (x *run) effect() bool {
	applied, _ := json.Marshal(x.stamp(trace{Kind: traceEffect}))
	refused, _ := json.Marshal(x.stamp(trace{Kind: traceFencedOut}))
	n, err := effectScript.Run(context.Background(), x.s.effects,
		[]string{traceKey(x.prefix, x.scope, x.key), fenceKey(x.prefix, x.scope, x.key)},
		x.fence, applied, refused).Int()
	if err != nil {
		// The application's database is never faulted: a failure here
		// is the rig's, and an effect of unknown fate would make every
		// count meaningless. The driver sees the instance exit.
		log.Fatalf("faultcheck instance %s: the effect failed: %v", x.s.spec.Name, err)
	}
	return n == 1
}

// trace appends to the key's server-side log.
func (x *run) trace(tr trace) { x.s.trace(x.prefix, x.scope, x.key, x.stamp(tr)) }

func (s *instance) trace(prefix, scope, key string, tr trace) {
	b, _ := json.Marshal(tr)
	if err := s.effects.RPush(context.Background(), traceKey(prefix, scope, key), b).Err(); err != nil {
		log.Fatalf("faultcheck instance %s: tracing failed: %v", s.spec.Name, err)
	}
}

func (x *run) stamp(tr trace) trace {
	tr.Exec, tr.Fence, tr.Instance, tr.At = x.exec, x.fence, x.s.spec.Name, time.Now().UnixNano()
	return tr
}

func (x *run) result(deliberate string) answerBody {
	return answerBody{Scope: x.scope, Key: x.key, Exec: x.exec, Fence: x.fence, Deliberate: deliberate}
}

func (x *run) body(deliberate string) []byte {
	b, _ := json.Marshal(x.result(deliberate))
	return b
}

// answer writes the execution's answer: 201, or a refusal of the handler's
// own, marked as such.
func (x *run) answer(w http.ResponseWriter, status int, deliberate string) {
	writeJSON(w, status, deliberate, x.result(deliberate))
}

func writeJSON(w http.ResponseWriter, status int, deliberate string, v answerBody) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	if deliberate != "" {
		w.Header().Set(deliberateHeader, deliberate)
	}
	w.WriteHeader(status)
	w.Write(b)
}
