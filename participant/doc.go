// Package participant is the SDK for services that take part in sagas: they
// register typed handlers for the commands (step actions), compensations
// and plain domain events routed to their queue, and the Client runs each
// delivery in one local transaction with its effect, so that a message
// delivered many times changes state once and every command gets a reply.
//
// # Handlers
//
// Commands are registered with the contract the saga definition uses:
//
//	var Reserve = saga.NewCommand[ReserveReq, ReserveReply]("inventory.reserve")
//	var Release = saga.NewCommand[ReleaseReq, saga.None]("inventory.release")
//
//	participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
//		// business writes in tx
//	})
//	participant.HandleCompensation(c, Release, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReleaseReq]) error { … })
//	participant.HandleEvent(c, "order.cancelled", func(ctx context.Context, tx pgx.Tx, ev *participant.Request[OrderCancelled]) error { … })
//
// A handler does its business writes in the tx it is given and never
// commits it. It returns Reject(err) for a business "no": the command gets a
// failure reply, its writes are rolled back and the saga compensates the
// steps before it. Any other error (or a panic) is transient: the message is
// retried with exponential backoff and jitter, and after Retry.MaxAttempts
// attempts it is dead-lettered and, if it belongs to a saga, answered with a
// failure reply (code CodeDeadLettered) so that no saga waits for it. A
// compensation cannot reject: when its retries run out the orchestrator
// learns that it failed and the saga becomes failed, for an operator.
//
// Handlers can send messages of their own, in the same transaction, with
// Client.Publish (see NewEvent).
//
// # Handlers that call an outside system
//
// A step whose effect is in a system outside the database (a payment
// provider) is registered with HandleOutsideCommand and
// HandleOutsideCompensation instead. Its delivery takes two transactions:
// the inbox entry and the barrier mark are committed "started" before the
// call; the call runs outside any transaction with an idempotency key of the
// saga step and phase (IdempotencyKey) that every redelivery and re-send
// shares; a second transaction records its outcome, the reply and the
// entry "done". A duplicate of a done message calls nothing; a message whose
// entry is still "started" (a crash between the call and the second
// commit) calls again with the same key and OutsideRequest.Resumed set. A
// compensation that arrives while its action is "started" waits for it.
//
// # One transaction per delivery
//
// For each delivery the Client, in one transaction: records the message id
// in the inbox (a duplicate only increments the inbox row's duplicates
// counter and is acknowledged); passes the compensation barrier (below);
// runs the handler; writes the reply to its own outbox. It commits, wakes
// its relay and only then acknowledges the delivery. A crash between commit
// and acknowledgement makes the broker deliver the message again; the inbox
// recognises it and the reply, committed with the effect, is published by
// the relay anyway.
//
// # The compensation barrier
//
// A step's action and its compensation meet in the barrier table, keyed by
// saga id, step (with the saga's run: a restarted saga's steps have marks
// of their own) and phase, in the same transaction as their effects. Hence
// a step's action and its compensation must be handled by the same
// participant (the same schema). The barrier makes the orchestrator free to
// compensate a step that timed out without knowing whether it ran:
//
//   - An action re-sent after a timeout (new message id, same saga and
//     step) runs at most once; later copies get the first run's reply.
//   - A compensation whose action never ran here is a no-op that replies
//     success ("null compensation"), and leaves a mark so that the action,
//     should it still arrive, is not applied and is answered with a failure
//     reply (code CodeCompensatedBeforeRun: "hanging action").
//   - A compensation runs at most once per step; repeats reply success.
//   - Compensating a rejected action is a no-op that replies success.
//
// # Poison messages
//
// A message whose type has no handler, whose payload is larger than
// MaxPayloadBytes or does not decode strictly into the request type is
// dead-lettered at once with a readable reason (and answered with a failure
// reply when it belongs to a saga). Messages whose envelope cannot be read
// at all are dead-lettered by the broker adapter before they reach the
// Client. Serialization failures and deadlocks are retried at once, a few
// times, before they count as a failed attempt. A handler run is bounded by
// HandlerTimeout (1 minute by default): one that returns later has failed,
// and is retried and dead-lettered like any failure.
//
// # Running
//
// Client.Run checks that the schema has the messaging migrations (and says
// which command to run if not), declares the service queue with every
// registered type routed to it, consumes it with Workers concurrent
// deliveries and runs the relay of the Client's outbox. When its context is
// cancelled it drains the deliveries in flight within StopTimeout.
//
// # Observability
//
// Every delivery runs in an OpenTelemetry consumer span, a child of the
// producer span that sent it, with its inbox outcome (new or duplicate);
// the handler's context carries that span, so the reply and the events it
// writes continue the saga's trace. The Client counts deliveries by
// outcome, duplicates, dead letters by reason class and retries, reports
// its outbox backlog and relay publishing, and logs every dead letter once
// at level Error. TracerProvider, MeterProvider and Logger come from Config;
// docs/operations.md lists every metric, span and log key.
package participant
