package orchestrator

import (
	"context"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/internal/engine"
	"github.com/sagabox/sagabox/transport"
)

// Sweep runs one deadline sweep pass now and returns how many sagas it
// claimed.
func (c *Client) Sweep(ctx context.Context) (int, error) { return c.sweep(ctx) }

// ApplyRequests runs one pass over the pending operator requests now.
func (c *Client) ApplyRequests(ctx context.Context) error { return c.applyRequests(ctx) }

// ProcessBatch applies ds as the delivery engine applies a batch of
// replies that arrived together.
func (c *Client) ProcessBatch(ctx context.Context, ds []*transport.Delivery) ([]engine.Result, error) {
	items := make([]engine.Item, len(ds))
	for i, d := range ds {
		items[i] = engine.Item{Ctx: ctx, Delivery: d}
	}
	res, _, err := processor{c}.ProcessBatch(ctx, items, nil)
	return res, err
}

// RoomFreshnessForTest is how long a Start trusts another Start's
// admission count.
const RoomFreshnessForTest = roomFreshness

// KeptRevisionForTest returns the revision of saga id in the Client's saga
// cache, and whether it keeps the saga.
func (c *Client) KeptRevisionForTest(id uuid.UUID) (int64, bool) {
	rec, ok := c.cache.get(id)
	return rec.Revision, ok
}
