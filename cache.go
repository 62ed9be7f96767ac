package idempotency

import (
	"container/list"
	"sync"
	"time"
)

// responseCache keeps completed responses in memory. A stored response
// never changes, so a duplicate that reaches the instance that served the
// original is answered without Redis. It is bounded by entries and bytes,
// evicting the least recently used, and an entry expires when its Redis
// record does.
type responseCache struct {
	mu         sync.Mutex
	maxEntries int
	maxBytes   int64
	bytes      int64
	index      map[identity]*list.Element
	lru        list.List // of *cacheEntry, most recent first
	// clock is the cache's time when it is not the wall clock: idemtest's,
	// which moves with its in-process Redis (FastForward).
	clock func() time.Time
}

type cacheEntry struct {
	id      identity
	fp      fingerprintSum
	rec     *record
	expires time.Time
	size    int64
}

func newResponseCache(maxEntries int, maxBytes int64) *responseCache {
	if maxEntries <= 0 || maxBytes <= 0 {
		return nil
	}
	return &responseCache{maxEntries: maxEntries, maxBytes: maxBytes, index: make(map[identity]*list.Element)}
}

// get returns the live entry for id, or nil. A nil cache holds nothing.
func (c *responseCache) get(id identity, now time.Time) *cacheEntry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.index[id]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return nil
	}
	c.lru.MoveToFront(el)
	return e
}

// now is the cache's time, for get. A nil cache has the wall clock.
func (c *responseCache) now() time.Time {
	if c == nil || c.clock == nil {
		return time.Now()
	}
	return c.clock()
}

// put remembers rec until expires. Responses larger than an eighth of the
// byte budget are not kept: one of them would evict many small ones.
func (c *responseCache) put(id identity, fp fingerprintSum, rec *record, expires time.Time) {
	if c == nil {
		return
	}
	size := rec.size()
	if size > c.maxBytes/8 {
		return
	}
	if c.clock != nil { // expires is on the wall clock
		expires = c.clock().Add(time.Until(expires))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.index[id]; ok {
		c.remove(el)
	}
	c.index[id] = c.lru.PushFront(&cacheEntry{id: id, fp: fp, rec: rec, expires: expires, size: size})
	c.bytes += size
	for len(c.index) > c.maxEntries || c.bytes > c.maxBytes {
		c.remove(c.lru.Back())
	}
}

func (c *responseCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.index, e.id)
	c.bytes -= e.size
}
