// Package orchestrator runs saga definitions (package saga) against
// PostgreSQL and a message broker: it starts sagas in the caller's
// transaction, sends each step's command through a transactional outbox,
// applies the participants' replies, fires step deadlines, and lets
// operators inspect sagas and retry, cancel, terminate or restart them.
//
// # Starting a saga
//
// Register the definitions with the Client (Config.Definitions or
// Client.Register), then start sagas inside your own transaction:
//
//	tx, _ := pool.Begin(ctx)
//	order := createOrder(ctx, tx)
//	started, err := orchestrator.Start(ctx, client, tx, CheckoutSaga, Checkout{OrderID: order.ID},
//		&orchestrator.StartOpts{StartKey: order.ID})
//	tx.Commit(ctx)
//	client.Wake() // optional: publish the first command at once
//
// The saga row, its history and its first command are written in tx, so a
// saga exists, and its first command is sent, if and only if tx commits. A
// StartKey makes the start idempotent: starting again with the same key
// returns the existing saga and sends nothing. Local steps
// (saga.LocalStep) run in the transaction of the moment, reachable with
// TxFromContext.
//
// # Running
//
// Client.Run checks that the schema has the messaging and saga migrations
// (and names the command to run if not), declares the reply queue (named
// Config.Service), and then, until its context is cancelled:
//
//   - applies replies, each in one transaction: the reply's message id goes
//     into the inbox (a duplicate is acknowledged without effect), the saga
//     row is locked FOR UPDATE (one saga's replies are applied one at a
//     time, whatever the number of orchestrator processes), the core decides
//     (saga.Runner.Apply), and the new state, its history and the next
//     command or compensation are written before the commit and the
//     acknowledgement;
//   - sweeps deadlines every SweepInterval (sooner when this Client wrote an
//     earlier one): due sagas are claimed with FOR UPDATE SKIP LOCKED and
//     their timer applied in the same transaction, so each deadline fires
//     once even with several orchestrators. The core re-sends a timed-out
//     command according to the step's RetryPolicy, then compensates;
//   - publishes the outbox (relay) and prunes old rows (Config.Retention).
//
// Serialization failures and deadlocks retry the transaction. A reply that
// cannot be applied goes to the reply queue's dead-letter queue with the
// reason, and is recorded on its saga (a HistoryReplyDeadLettered entry and
// LastError): a reply whose payload breaks the command's contract, or a
// reply for a saga whose definition version is not registered here (deploy
// an orchestrator that has it, then move the message back). Stale,
// duplicate or unexpected replies are recorded in the history as ignored
// and acknowledged; replies for sagas that do not exist are logged and
// acknowledged.
//
// # Time
//
// Every decision reads Config.Clock: tests can drive deadlines without
// sleeping.
//
// # Operations
//
// Get, History and List (oldest first, filtered by type, status and age,
// with paging) read sagas; Retry, Cancel, Terminate and Restart act on one,
// recording the actor and reason in its history; RequestAction records the
// same actions for an orchestrator that runs the saga's definition to
// apply (what the CLI and the console do). A saga that does not exist gives an error
// wrapping ErrNotFound; an action not allowed in the saga's status, one
// wrapping saga.ErrInvalidTransition.
//
// # Observability
//
// Start runs in a span in the caller's context; the commands it writes
// carry that span's trace, every reply is processed in a consumer span that
// continues it, and so one saga is one trace across the orchestrator and
// its participants. The Client counts sagas started and finished by type
// and status, step and saga durations, deadlines fired, retries, replies
// by outcome and dead letters, and reports its outbox backlog and the sagas
// past their deadline. TracerProvider, MeterProvider and Logger come from
// Config; docs/operations.md lists every metric, span and log key.
package orchestrator
