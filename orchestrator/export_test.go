package orchestrator

import "context"

// Sweep runs one deadline sweep pass now and returns how many sagas it
// claimed.
func (c *Client) Sweep(ctx context.Context) (int, error) { return c.sweep(ctx) }
