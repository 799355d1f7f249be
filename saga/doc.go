// Package saga is the pure core of sagabox: the typed DSL that defines a
// saga, the command contracts that the orchestrator and the participants
// share, and the transition function that decides what a saga does next.
//
// It performs no I/O and reads no clock. The orchestrator stores an Instance
// (as JSON), feeds it Events (replies, timers, operator actions) together
// with the time they happened, and writes back the Result: the new Instance,
// the commands to put in its outbox, and the history entries to record. Given
// the same Instance and Event, Apply always returns the same Result.
//
// # Defining a saga
//
// A Definition has a stable name, a version, a typed data struct D and an
// ordered list of steps. Each step either invokes a command at a participant
// (Invoke) or runs a local function in the orchestrator's own transaction
// (LocalStep). A step may declare a compensation (Compensate), a timeout
// (WithTimeout), a retry policy (WithRetry) and a predicate that skips it
// (When):
//
//	reserve := saga.NewCommand[ReserveReq, ReserveReply]("inventory.reserve")
//	release := saga.NewCommand[ReleaseReq, saga.None]("inventory.release")
//
//	var Checkout = saga.MustNew("checkout", 1,
//		saga.Step("reserve-stock",
//			saga.Invoke(reserve, buildReserve, applyReserve),
//			saga.Compensate(release, buildRelease),
//			saga.WithTimeout[Order](30*time.Second),
//			saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3}),
//		),
//		saga.LocalStep("mark-paid", markPaid),
//	)
//
// # Semantics
//
// Steps run one at a time, in order. A success reply applies the reply to
// the data and moves on; a failure reply (a business rejection) starts the
// compensation of the steps that succeeded before, in reverse order. A step
// whose deadline passes is re-sent while its retry policy allows and is then
// compensated, its own compensation first because it may have run. A reply
// that does not belong to the step and phase in flight is ignored and
// recorded. A compensation that fails leaves the saga failed until an
// operator retries it.
//
// A Parallel group runs its branches side by side: their commands are sent
// together, the saga moves on when all have succeeded (their replies are
// applied in declaration order), and when one fails the others are
// compensated together before the steps before the group. A WaitEvent step
// waits for an outside event the application sends. An operator can cancel
// (compensate), terminate (stop without compensating), retry, or restart a
// failed or compensated saga from a step. See Runner.Apply for the details.
//
// Package sagatest drives a definition through scenarios in unit tests.
package saga
