package store

import "github.com/sagabox/sagabox/store/internal/dbsqlc"

// ClaimSQLForTest exposes the claim statement so tests can EXPLAIN it.
func ClaimSQLForTest() string { return dbsqlc.OutboxClaimSQL }
