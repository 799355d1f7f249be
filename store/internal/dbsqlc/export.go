package dbsqlc

// OutboxClaimSQL is the claim statement, exported for EXPLAIN in tests.
const OutboxClaimSQL = outboxClaim

// SagaWriteSQL is the transition write, exported for EXPLAIN in tests.
const SagaWriteSQL = sagaWrite

// SagaLockSQL is the lock of sagas, exported for EXPLAIN in tests.
const SagaLockSQL = sagaLock

// DeliveryBeginManySQL and DeliveryFinishManySQL are a participant group's
// statements, exported for EXPLAIN in tests.
const (
	DeliveryBeginManySQL  = deliveryBeginMany
	DeliveryFinishManySQL = deliveryFinishMany
)

// OutboxDeadListSQL and InboxAttemptListSQL are the paged listings of dead
// rows and attempts, exported for EXPLAIN in tests.
const (
	OutboxDeadListSQL   = outboxDeadList
	InboxAttemptListSQL = inboxAttemptList
)
