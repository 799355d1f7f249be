package store

import "github.com/sagabox/sagabox/store/internal/dbsqlc"

// ClaimSQLForTest exposes the claim statement so tests can EXPLAIN it.
func ClaimSQLForTest() string { return dbsqlc.OutboxClaimSQL }

// ClaimPlanForTest exposes the planner settings the claim runs with.
func ClaimPlanForTest() string { return claimPlan }
