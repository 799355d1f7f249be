package participant

import "github.com/sagabox/sagabox/transport"

// SetTestHookAfterCommit makes c call f after each delivery's transaction
// committed, before the relay is woken and the delivery acknowledged.
func SetTestHookAfterCommit(c *Client, f func(d *transport.Delivery)) { c.testHookAfterCommit = f }
