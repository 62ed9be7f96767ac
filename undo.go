package idempotency

import (
	"context"
	"sync"
)

// Undoing a claim that may have run without us hearing back (its reply was
// lost) happens in the background: the client's 503 must not wait for a
// Redis that just failed us. Left undone, the claim reads as an interrupted
// execution (409) for the record's whole lifetime, although no handler ran;
// so no undo is dropped while there is room to queue it.
//
// During an outage every request's claim fails, nearly all without reaching
// Redis, and each retrying undo would otherwise be a goroutine of its own:
// thousands, all knocking on a Redis that is coming back. They wait in a
// queue instead, worked by a few goroutines that exist only while it holds
// something.
const (
	undoWorkers  = 32
	undoQueueLen = 8192
)

type undoJob struct {
	k     keys
	value string
}

type undos struct {
	queue   chan undoJob
	mu      sync.Mutex
	working int
}

func newUndos() undos { return undos{queue: make(chan undoJob, undoQueueLen)} }

// undoInBackground queues the release of the claim made under value.
func (m *Middleware) undoInBackground(k keys, value string) {
	select {
	case m.undos.queue <- undoJob{k, value}:
	default:
		m.cfg.logger.Warn("idempotency: too many claims to undo at once; this one is left to its lease, "+
			"after which a retry finds it interrupted", "key", k.record)
		return
	}
	m.undos.mu.Lock()
	start := m.undos.working < undoWorkers
	if start {
		m.undos.working++
	}
	m.undos.mu.Unlock()
	if start {
		go m.undoWorker()
	}
}

// undoWorker releases queued claims, each tried for up to a lease, until
// the queue is empty.
func (m *Middleware) undoWorker() {
	for {
		select {
		case job := <-m.undos.queue:
			m.release(context.Background(), job.k, job.value, m.cfg.lease)
			continue
		default:
		}
		m.undos.mu.Lock()
		if len(m.undos.queue) > 0 { // queued after the check above
			m.undos.mu.Unlock()
			continue
		}
		m.undos.working--
		m.undos.mu.Unlock()
		return
	}
}
