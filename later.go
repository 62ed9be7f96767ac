package idempotency

import (
	"context"
	"sync"
	"time"
)

// What Redis did not answer now is done later: the release of a claim whose
// reply was lost or whose release failed, and the store of an answer that
// Redis did not take. The caller's answer never waits for a Redis that just
// failed it. Left undone, a released claim would read as interrupted (409)
// for the record's whole lifetime although nothing ran, and a stored
// answer would be lost; so no job is dropped while there is room for it.
//
// During an outage every request fails, nearly all without reaching Redis,
// and each retrying job would otherwise be a goroutine of its own:
// thousands, all knocking on a Redis that is coming back. They wait in a
// queue instead, bounded in jobs and in the bytes of the answers they hold,
// and worked by a few goroutines that exist only while it holds something.
const (
	laterWorkers  = 32
	laterQueueLen = 8192
	laterBytes    = 64 << 20
)

type laterJob struct {
	k    keys
	what string // "release" or "store", for the log
	size int64  // the bytes of the answer it holds
	try  func(context.Context) error
}

type later struct {
	m       *Middleware
	queue   chan laterJob
	mu      sync.Mutex
	working int
	bytes   int64
}

func newLater(m *Middleware) *later {
	return &later{m: m, queue: make(chan laterJob, laterQueueLen)}
}

// add queues a job, to be tried until it succeeds or a lease has passed.
func (q *later) add(k keys, what string, size int64, try func(context.Context) error) {
	q.mu.Lock()
	if q.bytes+size > laterBytes {
		q.mu.Unlock()
		q.drop(k, what)
		return
	}
	select {
	case q.queue <- laterJob{k, what, size, try}:
	default:
		q.mu.Unlock()
		q.drop(k, what)
		return
	}
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

func (q *later) drop(k keys, what string) {
	q.m.cfg.logger.Warn("idempotency: too much left to do once Redis answers; this "+what+" is left undone, "+
		"and retries find the key interrupted once its lease ends", "key", k.record)
}

// work does queued jobs until the queue is empty.
func (q *later) work() {
	for {
		select {
		case job := <-q.queue:
			q.do(job)
			q.mu.Lock()
			q.bytes -= job.size
			q.mu.Unlock()
			continue
		default:
		}
		q.mu.Lock()
		if len(q.queue) > 0 { // queued after the check above
			q.mu.Unlock()
			continue
		}
		q.working--
		q.mu.Unlock()
		return
	}
}

// do tries job, pausing longer each time, for up to a lease: the lock of
// the key it settles lives at least two thirds of one after its last
// renewal, so a job that lands within it is seen by nobody as interrupted.
func (q *later) do(job laterJob) {
	deadline := time.Now().Add(q.m.cfg.lease)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		ctx, cancel := q.m.store.stepContext(context.Background())
		err := job.try(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().Add(pause).After(deadline) {
			q.m.cfg.logger.Warn("idempotency: Redis did not answer a "+job.what+" in time; retries find the "+
				"key interrupted once its lease ends", "key", job.k.record, "error", err)
			return
		}
		time.Sleep(pause)
	}
}
