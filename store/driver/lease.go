package driver

import "time"

// BeginOpts are the options of a transaction (Executor.Begin).
type BeginOpts struct {
	// Lease, when set, is the relay's write-time lease: the outbox rows the
	// transaction's operations write (a transition's commands, a delivery's
	// reply) are claimed for the relay by the statement that inserts them,
	// and Commit returns them (Committed.Leased) for the relay to publish
	// without a claim. Nil: rows are written for a claim to find.
	Lease *OutboxLease
}

// OutboxLease is the relay's write-time lease. A row whose ordering key has
// an earlier unpublished row (other than Confirmed) is written unclaimed
// instead, for a claim to take in key order. Rows leased by a process that
// dies before publishing them are claimed by another relay once the lease
// ends, as claimed rows are.
type OutboxLease struct {
	// Lease is how long the rows belong to the relay; ClaimedBy names it.
	Lease     time.Duration
	ClaimedBy string
	// Confirmed are rows the relay has published and not settled yet: they
	// do not hold a later row of their key back.
	Confirmed []int64
}

// Committed is what a committed transaction wrote to the outbox
// (Tx.Commit).
type Committed struct {
	// Leased are the rows written under the transaction's lease, in write
	// order, as a claim would return them: the relay publishes them
	// without a claim.
	Leased []OutboxRow
	// Unleased counts the rows written without the lease (all of them
	// without one; a row its key held back; a handler's own messages and a
	// saga a local step started, written in the transaction's savepoints):
	// a claim must find them, so the relay is woken.
	Unleased int
}

// Add returns what c and o wrote together: the transactions of one
// delivery.
func (c Committed) Add(o Committed) Committed {
	return Committed{Leased: append(c.Leased, o.Leased...), Unleased: c.Unleased + o.Unleased}
}
