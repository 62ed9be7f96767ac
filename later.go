package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"weak"
)

// What Redis did not answer now is done later: the release of a claim whose
// reply was lost or whose release failed, and the store of an answer that
// Redis did not take. The caller's answer never waits for a Redis that just
// failed it. Left undone, a released claim would read as interrupted (409)
// although nothing ran, and a stored answer would be lost; so no job is
// ever dropped. A store is tried until it succeeds or until the key's
// record has expired, when nothing it could write would still count; a
// release, which can never undo an effect, for as long as the process
// lives. Past the claim horizon a claim reads the key interrupted
// meanwhile, and the store that lands later turns it into a replayed one.
//
// The queue is bounded by back-pressure, not by dropping: every call that
// may leave a job behind is admitted first (enter), and while the queue
// holds laterJobs jobs or laterBytes bytes of answers, new calls are
// refused with 503 before they claim anything. A call admitted before the
// queue filled still queues its job, so the bounds are exceeded by at most
// the calls in flight, each by one job and one answer (WithMaxResponseBytes).
//
// Refused sooner: while laterOutage jobs wait and the last try failed,
// Redis is down or stalled, and a new call would only wait out its store
// timeout to fail, and leave the undo of a claim that may never have
// reached Redis (go-redis cannot say) behind in the queue. It is refused at
// once instead; the queue's own tries tell when Redis answers again.
//
// During an outage each retrying job would otherwise be a goroutine of its
// own, all knocking on a Redis that is coming back. They wait in a queue,
// worked by at most laterWorkers goroutines that exist only while it holds
// something. While the last try failed, one job at a time tries, and not
// before a pause that grows with each failure (50 ms to 500 ms): the store
// meets one try per pause from each process, not one per job. A database
// whose queue of new connections a storm of retries keeps full (every
// connection abandoned at the store timeout before it is accepted, and
// retried) would never come back. Shutdown drains the queue.
const (
	laterWorkers = 32
	laterJobs    = 8192
	laterBytes   = 64 << 20
	laterOutage  = 64
)

type laterJob struct {
	k        keys
	what     string // "release" or "store", for the log
	size     int64  // the bytes of the answer it holds
	deadline time.Time
	try      func(context.Context) error
}

type later struct {
	m  *Middleware
	mu sync.Mutex
	// queue holds the jobs nobody works on yet; pending every job not done,
	// worked or queued, so that an unfinished drain can name their keys.
	queue   []*laterJob
	pending map[*laterJob]struct{}
	bytes   int64
	working int
	// calls are the calls admitted to claim that have not ended: each may
	// still queue a job, and an unfinished drain names their keys.
	calls   map[*call]struct{}
	closing bool
	failing bool // the last try failed
	// While failing: a job is trying (probing), and none tries before
	// notBefore, backoff after the last failure; recovered is closed for
	// the jobs waiting their turn once a try succeeds.
	probing   bool
	notBefore time.Time
	backoff   time.Duration
	recovered chan struct{}
	// changed is closed whenever a job ends or a call leaves, while
	// Shutdown waits on it (nil otherwise: a call costs no channel).
	changed chan struct{}
}

func newLater(m *Middleware) *later {
	return &later{m: m, pending: map[*laterJob]struct{}{}, calls: map[*call]struct{}{}}
}

// Why enter refuses a call: it could leave work that nothing would do.
// errBacklog: the background queue is full, or Redis is failing with work
// queued; errShuttingDown: Shutdown has begun.
var (
	errBacklog      = errors.New("too many stores and releases wait to be tried again")
	errShuttingDown = errors.New("shutting down")
)

// enter admits a call that may claim a key: it returns an error to refuse
// it with while the queue is full or a drain has begun. Every admitted call
// leaves.
func (q *later) enter(c *call) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closing:
		return unavailable(errShuttingDown)
	case len(q.pending) >= laterJobs || q.bytes >= laterBytes || (q.failing && len(q.pending) >= laterOutage):
		// Answered 503 store-unavailable, which outage.go logs.
		return unavailable(fmt.Errorf("%w (%d jobs, %d bytes)", errBacklog, len(q.pending), q.bytes))
	}
	q.calls[c] = struct{}{}
	return nil
}

// leave ends an admitted call.
func (q *later) leave(c *call) {
	q.mu.Lock()
	delete(q.calls, c)
	q.signal()
	q.mu.Unlock()
}

// add queues a job, to be tried until it succeeds or deadline passes (zero:
// until it succeeds). It never drops one: enter bounds how many there can
// be.
func (q *later) add(k keys, what string, size int64, deadline time.Time, try func(context.Context) error) {
	job := &laterJob{k: k, what: what, size: size, deadline: deadline, try: try}
	q.mu.Lock()
	q.queue = append(q.queue, job)
	q.pending[job] = struct{}{}
	q.bytes += size
	start := q.working < laterWorkers
	if start {
		q.working++
	}
	q.mu.Unlock()
	if start {
		go q.work()
	}
}

// work does queued jobs until the queue is empty.
func (q *later) work() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.working--
			q.signal()
			q.mu.Unlock()
			return
		}
		job := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.mu.Unlock()

		q.do(job)

		q.mu.Lock()
		delete(q.pending, job)
		q.bytes -= job.size
		q.signal()
		q.mu.Unlock()
	}
}

// signal wakes Shutdown; q.mu is held.
func (q *later) signal() {
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
}

// do tries job, pausing longer each time, until it succeeds or its deadline
// passes (a job without one: until it succeeds), or the application closed
// the Redis client or the database, which nothing will answer any more.
func (q *later) do(job *laterJob) {
	var err error
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		probe, ok, recovered := q.turn()
		if ok {
			ctx, cancel := q.m.stepContext(context.Background())
			err = job.try(ctx)
			cancel()
			closed := err != nil && q.m.storeClosed(err)
			q.tried(err, probe, closed)
			if err == nil {
				return
			}
			if closed {
				q.m.cfg.logger.Error("idempotency: "+q.m.storeName()+" was closed with a "+job.what+" undone (call "+
					"Middleware.Shutdown before closing it); retries may find the key interrupted", "key", job.k.record)
				return
			}
		}
		if !job.deadline.IsZero() && time.Now().Add(pause).After(job.deadline) {
			q.m.cfg.logger.Warn("idempotency: "+q.m.storeWord()+" did not take a "+job.what+" for as long as the key's "+
				"record lives; it is dropped", "key", job.k.record, "error", err)
			return
		}
		timer := time.NewTimer(pause)
		select {
		case <-recovered: // the store answers again: every job goes on at once (nil: never)
		case <-timer.C:
		}
		timer.Stop()
	}
}

// turn reports whether a job may try now: any while the last try
// succeeded; while it failed, one at a time (the probe), once the pause
// after that failure is over. A job that may not try gets what tells it
// that a try succeeded.
func (q *later) turn() (probe, ok bool, recovered <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !q.failing:
		return false, true, nil
	case q.probing || time.Now().Before(q.notBefore):
		if q.recovered == nil {
			q.recovered = make(chan struct{})
		}
		return false, false, q.recovered
	}
	q.probing = true
	return true, true, nil
}

// tried records a try's error (nil when it succeeded); probe says whether
// it was the probe, closed whether the application closed the store, which
// then fails every job at once rather than one per pause.
func (q *later) tried(err error, probe, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failing = err != nil
	if probe {
		q.probing = false
	}
	switch {
	case err == nil:
		q.backoff = 0
		if q.recovered != nil {
			close(q.recovered)
			q.recovered = nil
		}
	case !closed:
		q.backoff = min(max(2*q.backoff, 50*time.Millisecond), 500*time.Millisecond)
		q.notBefore = time.Now().Add(q.backoff)
	}
}

// storeClosed reports whether err says that the application closed the
// store: the Redis client, or NewSQL's database (database/sql's error for
// it is not exported; the database is asked instead). Nothing will answer
// any more.
func (m *Middleware) storeClosed(err error) bool {
	if neverSent(err) { // the Redis client's
		return true
	}
	s, ok := m.keyStore.(*sqlStore)
	return ok && closed(s.db)
}

// storeWord is what keeps the keys, as the log names it in a sentence.
func (m *Middleware) storeWord() string { return cmp.Or(m.outage.store, "Redis") }

// storeName is what keeps the keys, for the log.
func (m *Middleware) storeName() string {
	if m.redis != nil {
		return "the Redis client"
	}
	return "the database (*sql.DB)"
}

// Shutdown waits until every call the Middleware admitted has ended and
// every store and release that Redis did not answer at once has been done
// in the background: call it when the server has stopped taking requests
// (after http.Server.Shutdown returns, or when a queue consumer has
// stopped), before the process exits. From its call on, calls that this
// process's memory does not answer are refused (503 store-unavailable for
// a request, ErrStoreUnavailable for Do), so that the drain ends.
//
// When ctx ends first, Shutdown logs the key of each store or release left
// undone, and of each call still running (once the process has exited, a
// retry of those keys finds them interrupted past the claim horizon; an
// operator settles them with idemctl) and returns ctx's error. The work
// goes on in the background while the process lives.
func (m *Middleware) Shutdown(ctx context.Context) error {
	q := m.later
	for {
		q.mu.Lock()
		q.closing = true
		if len(q.calls) == 0 && len(q.pending) == 0 {
			q.mu.Unlock()
			return nil
		}
		if q.changed == nil {
			q.changed = make(chan struct{})
		}
		changed := q.changed
		q.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			q.abandon()
			return ctx.Err()
		}
	}
}

// Shutdown drains every Middleware that New made in this process and that
// is still in use, as Middleware.Shutdown does for one, all at once, and
// returns their errors joined: the way to drain the Middlewares that
// one-liners (ProtectKey) made, and to drain them all without a list.
// Like net/http's package-level helpers, it serves programs that keep no
// handle; a program that does may call each Middleware's Shutdown. It
// drains the Middlewares that exist when it is called: one that New makes
// after that is not drained.
func Shutdown(ctx context.Context) error {
	var wg sync.WaitGroup
	live := everyMiddleware()
	errs := make([]error, len(live))
	for i, m := range live {
		wg.Go(func() { errs[i] = m.Shutdown(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// made holds every Middleware that New made, for Shutdown: weakly, so that
// one the program no longer uses is collected (one with work left to do
// is in use, by that work).
var made struct {
	mu   sync.Mutex
	all  []weak.Pointer[Middleware]
	live int // how many were live at the last prune
}

// remember adds m to made, and drops the collected ones whenever the list
// has doubled since the last prune.
func remember(m *Middleware) {
	made.mu.Lock()
	defer made.mu.Unlock()
	if len(made.all) >= 2*made.live+16 {
		made.all = slices.DeleteFunc(made.all, func(p weak.Pointer[Middleware]) bool { return p.Value() == nil })
		made.live = len(made.all)
	}
	made.all = append(made.all, weak.Make(m))
}

// everyMiddleware lists the Middlewares of made not collected yet.
func everyMiddleware() []*Middleware {
	made.mu.Lock()
	defer made.mu.Unlock()
	var live []*Middleware
	for _, p := range made.all {
		if m := p.Value(); m != nil {
			live = append(live, m)
		}
	}
	return live
}

// abandon logs what a drain left undone.
func (q *later) abandon() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for job := range q.pending {
		q.m.cfg.logger.Error("idempotency: shutdown: a "+job.what+" "+q.m.storeWord()+" has not taken is left undone; "+
			"settle the key with idemctl if it reads interrupted", "key", job.k.record)
	}
	for c := range q.calls {
		// Claimed and still running, its key reads in progress, then
		// interrupted once the process has exited before it ended.
		q.m.cfg.logger.Error("idempotency: shutdown: a call is still running; if the process exits before it "+
			"ends, settle the key with idemctl if it reads interrupted", "key", q.m.redisKeys(c).record)
	}
	if len(q.calls) > 0 {
		q.m.cfg.logger.Error("idempotency: shutdown: calls were still running", "calls", len(q.calls))
	}
}
