package driver

import "errors"

// The errors an executor's operations and transactions are marked with, so
// that the engine can tell what a failure calls for without knowing the
// database behind the driver. The implementation marks its errors at the
// seam (errors.Is finds the mark; the message stays the database's), the way
// River's drivers interpret PostgreSQL's errors into their own.
var (
	// ErrConflict marks a failure that running the whole transaction again
	// may cure: a serialization failure or a deadlock, and the write of a
	// transition computed from a saga that changed meanwhile.
	ErrConflict = errors.New("transaction conflict: run it again")
	// ErrConnection marks a failure to reach the database or a connection
	// lost under a statement (a restart, a network fault): not the
	// statement's fault, so a delivery it interrupts is retried without
	// counting an attempt.
	ErrConnection = errors.New("database connection failed")
	// ErrDataRefused marks the database refusing a statement's data (text
	// it cannot hold, a key too long for its index): running the statement
	// again with the same data fails the same way.
	ErrDataRefused = errors.New("database refused the data")
	// ErrPrivilege marks the database refusing a statement for want of a
	// privilege: the role lacks a grant, which an operator gives. Like a
	// lost connection it is not the message's fault: a delivery it
	// interrupts is retried without counting an attempt.
	ErrPrivilege = errors.New("database role lacks a privilege")
)
