package participant

import "github.com/sagabox/sagabox/transport"

// SetTestHookAfterCommit makes c call f after each delivery's transaction
// committed, before the relay is woken and the delivery acknowledged.
func SetTestHookAfterCommit(c *Client, f func(d *transport.Delivery)) { c.testHookAfterCommit = f }

// SetTestHookAfterCall makes c call f after each outside call returned,
// before its outcome is recorded; an error from f ends the delivery there.
func SetTestHookAfterCall(c *Client, f func(d *transport.Delivery) error) { c.testHookAfterCall = f }
