package idempotency

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
)

// recoverAnswer settles an abandoned execution that l has just taken over,
// from the outcome store (WithOutcomeStore): the answer the abandoned
// executor committed is stored in Redis and replayed; when it committed
// nothing, the store has fenced it out and the handler runs again under l.
func (m *Middleware) recoverAnswer(c *call, l *lease) (*lease, verdict) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), m.cfg.execTimeout)
	a, committed, err := m.cfg.outcomes.Recover(ctx, l.k.record, l.fence)
	cancel()
	if err == nil && !committed && l.wd.isLost() {
		err = ErrLockLost // another instance may have taken the key over: it runs, not us
	}
	switch {
	case errors.Is(err, ErrUnreadableRecord):
		// It committed, and what it answered cannot be read: as for a
		// record in Redis that cannot be decoded, retrying cannot help.
		m.cfg.logger.Error("idempotency: an abandoned execution's committed answer cannot be read",
			"key", l.k.record, "error", err)
		l.end()
		m.letGo(c, l)
		return nil, refuse(ErrUnreadableRecord)
	case err != nil:
		// Whether the abandoned execution committed is still unknown. The
		// key stays claimed under our lock value, so once the lock is gone
		// a retry takes the execution over and asks again.
		m.cfg.logger.Warn("idempotency: could not recover an abandoned execution from the outcome store",
			"key", l.k.record, "error", err)
		l.end()
		m.letGo(c, l)
		return nil, refuse(unavailable(err))
	case !committed:
		m.cfg.logger.Info("idempotency: an abandoned execution committed nothing; running the handler again",
			"key", l.k.record, "fence", l.fence)
		return l, verdict{}
	case a.Fingerprint != hex.EncodeToString(c.fp[:]):
		// The store's answer is for another request under this key: Redis
		// lost the record it had, and the key was reused meanwhile.
		l.end()
		m.release(c.ctx, l.k, l.value(), 0)
		return nil, refuse(ErrKeyReused)
	case a.Status < 100 || a.Status > 999:
		l.end()
		m.letGo(c, l)
		return nil, refuse(ErrUnreadableRecord)
	}
	if len(a.Body) > m.cfg.maxResponse {
		// As for an answer recorded over the limit: executed, and not
		// replayed to duplicates.
		m.storeAnswer(c, l, nil, StoreDecision{TTL: m.cfg.recordTTL})
		return nil, refuse(ErrNotReplayable)
	}
	rec := m.recordOf(a)
	m.cfg.logger.Info("idempotency: recovered an abandoned execution's committed answer", "key", l.k.record)
	// Replayed even when Redis cannot keep it now: the answer is committed,
	// and the next retry recovers it again.
	m.storeAnswer(c, l, rec, StoreDecision{TTL: m.cfg.recordTTL})
	return nil, m.replay(c, c.fp, rec)
}

// letGo frees the key's lock and leaves its record as it is.
func (m *Middleware) letGo(c *call, l *lease) {
	ctx, cancel := m.store.stepContext(c.ctx)
	defer cancel()
	l.lock.Release(ctx)
}

// recordOf turns a committed answer into a record, keeping the headers
// this middleware stores, in a stable order.
func (m *Middleware) recordOf(a Answer) *record {
	names := make([]string, 0, len(a.Header))
	for name := range a.Header {
		if name = http.CanonicalHeaderKey(name); m.cfg.storable(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var pairs []string
	for _, name := range names {
		for _, v := range a.Header.Values(name) {
			pairs = append(pairs, name, v)
		}
	}
	rec := newRecord(a.Status, pairs, a.Body)
	rec.filtered = true
	return rec
}
