package store

import "github.com/sagabox/sagabox/store/internal/dbsqlc"

// ClaimSQLForTest exposes the claim statement so tests can EXPLAIN it.
func ClaimSQLForTest() string { return dbsqlc.OutboxClaimSQL }

// ClaimPlanForTest exposes the planner settings the claim runs with.
func ClaimPlanForTest() string { return claimPlan }

// SagaWriteSQLForTest exposes the transition write so tests can EXPLAIN it.
func SagaWriteSQLForTest() string { return dbsqlc.SagaWriteSQL }

// WritePlanForTest exposes the planner setting the transition write runs
// under.
func WritePlanForTest() string { return writePlan }

// SagaLockSQLForTest exposes the lock of sagas so tests can EXPLAIN it.
func SagaLockSQLForTest() string { return dbsqlc.SagaLockSQL }

// DeliveryBeginManySQLForTest and DeliveryFinishManySQLForTest expose a
// participant group's statements so tests can EXPLAIN them.
func DeliveryBeginManySQLForTest() string  { return dbsqlc.DeliveryBeginManySQL }
func DeliveryFinishManySQLForTest() string { return dbsqlc.DeliveryFinishManySQL }

// OutboxDeadListSQLForTest and InboxAttemptListSQLForTest expose the paged
// listings so tests can EXPLAIN them.
func OutboxDeadListSQLForTest() string   { return dbsqlc.OutboxDeadListSQL }
func InboxAttemptListSQLForTest() string { return dbsqlc.InboxAttemptListSQL }
