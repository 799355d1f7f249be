package driver

import (
	"context"
	"time"
)

// OutboxLease is the write-time lease of a delivery's transaction: the
// outbox rows its transition write inserts are claimed by the relay at once,
// in the inserting statement, and handed to that relay when the transaction
// commits, so that they are published without a claim. A row whose ordering
// key has an earlier unpublished row (other than Confirmed) is written
// unclaimed instead, for a claim to take in key order. Rows leased by a
// process that dies before publishing them are claimed by another relay once
// the lease ends, as claimed rows are.
type OutboxLease struct {
	// Schema is the schema whose outbox the relay publishes: a write to
	// another schema takes no lease.
	Schema string
	// Lease is how long the rows belong to the relay; ClaimedBy names it.
	Lease     time.Duration
	ClaimedBy string
	// Confirmed are rows the relay has published and not settled yet: they
	// do not hold a later row of their key back.
	Confirmed []int64
	// Committed is called once a write under the lease has committed, with
	// the rows it leased (in id order) and how many rows it wrote unleased.
	Committed func(leased []OutboxRow, unleased int)
	// Unleased is called by the other writes to the outbox under the
	// lease's context, which take no lease (a handler's own messages, a
	// saga started in the transaction), with how many rows they wrote: a
	// claim must find them, so the relay is woken.
	Unleased func(rows int)
}

// NoteUnleased tells the lease ctx carries for schema, if any, of rows
// written to its outbox without it.
func NoteUnleased(ctx context.Context, schema string, rows int) {
	if l := OutboxLeaseFrom(ctx, schema); l != nil && l.Unleased != nil && rows > 0 {
		l.Unleased(rows)
	}
}

type outboxLeaseKey struct{}

// WithOutboxLease returns ctx carrying l: the engine's transition writes
// under ctx that commit their own transaction take it.
func WithOutboxLease(ctx context.Context, l *OutboxLease) context.Context {
	return context.WithValue(ctx, outboxLeaseKey{}, l)
}

// OutboxLeaseFrom returns the lease ctx carries for writes to schema, or
// nil.
func OutboxLeaseFrom(ctx context.Context, schema string) *OutboxLease {
	l, _ := ctx.Value(outboxLeaseKey{}).(*OutboxLease)
	if l == nil || l.Schema != schema || l.Lease <= 0 {
		return nil
	}
	return l
}
