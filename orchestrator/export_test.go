package orchestrator

import "context"

// Sweep runs one deadline sweep pass now and returns how many sagas it
// claimed.
func (c *Client) Sweep(ctx context.Context) (int, error) { return c.sweep(ctx) }

// ApplyRequests runs one pass over the pending operator requests now.
func (c *Client) ApplyRequests(ctx context.Context) error { return c.applyRequests(ctx) }
