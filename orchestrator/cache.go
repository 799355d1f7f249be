package orchestrator

import (
	"bytes"
	"container/list"
	"sync"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// sagaCache keeps running sagas as this Client last wrote them
// (Config.SagaCache), so that a reply to one is applied without reading
// it: the write's revision check, not the cache, is what makes that safe.
// An entry is only a guess at the stored row; a wrong guess costs a
// transaction run again. The zero size keeps nothing; a nil *sagaCache is
// an empty cache.
type sagaCache struct {
	mu   sync.Mutex
	max  int
	lru  *list.List // of driver.SagaRecord, most recently used first
	byID map[uuid.UUID]*list.Element
}

// newSagaCache returns a cache of up to max sagas; nil when max is not
// positive.
func newSagaCache(max int) *sagaCache {
	if max <= 0 {
		return nil
	}
	return &sagaCache{max: max, lru: list.New(), byID: make(map[uuid.UUID]*list.Element, max)}
}

// get returns the saga id as last kept.
func (c *sagaCache) get(id uuid.UUID) (driver.SagaRecord, bool) {
	if c == nil {
		return driver.SagaRecord{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[id]
	if !ok {
		return driver.SagaRecord{}, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(driver.SagaRecord), true
}

// put keeps rec, a saga as stored by a committed write (or the caller's
// transaction about to commit), in place of what was kept of it. A saga
// that no longer runs is dropped instead: no reply is applied to it, and a
// late one reads it.
func (c *sagaCache) put(rec *driver.SagaRecord) {
	if c == nil {
		return
	}
	switch saga.Status(rec.Status) {
	case saga.StatusRunning, saga.StatusCompensating:
	default:
		c.forget(rec.ID)
		return
	}
	// A copy of its own: the caller's record (an operator's result, say)
	// may share its bytes with code that changes them.
	kept := *rec
	kept.Data, kept.Steps = bytes.Clone(rec.Data), bytes.Clone(rec.Steps)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byID[rec.ID]; ok {
		e.Value = kept
		c.lru.MoveToFront(e)
		return
	}
	c.byID[rec.ID] = c.lru.PushFront(kept)
	for c.lru.Len() > c.max {
		last := c.lru.Back()
		delete(c.byID, c.lru.Remove(last).(driver.SagaRecord).ID)
	}
}

// forget drops the sagas ids: their stored state is not known any more (a
// write that failed, or one in a caller's transaction that may not commit).
func (c *sagaCache) forget(ids ...uuid.UUID) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if e, ok := c.byID[id]; ok {
			c.lru.Remove(e)
			delete(c.byID, id)
		}
	}
}

// len returns how many sagas are kept.
func (c *sagaCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
